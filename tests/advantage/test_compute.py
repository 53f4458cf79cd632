"""The one route from rewards to advantages (``advantage/compute.py``): every estimator and aggregation
against a naive loop, with unscorable rows (NaN) in a group and a whole unscorable group, on groups that do
not split evenly over ranks; and two ranks (threads with a fake ``Collectives``) against one process that
holds both ranks' rows."""

from __future__ import annotations

import math

import pytest
import torch

from fake_ranks import ThreadRanks
from slimgrpo.advantage.compute import AdvantageSettings, compute_advantages
from slimgrpo.advantage.estimators import EPS
from slimgrpo.collectives import SINGLE
from slimgrpo.config import from_dict
from slimgrpo.containers import RewardOutput

NAN = float("nan")
G = 3
# 5 groups of 3 (15 rows: 2 ranks cannot take half each, so rank 0 takes 3 groups and rank 1 two);
# group 1 has an unscorable row, group 3 is unscorable as a whole, group 4 has a single scorable row.
PER_FN = torch.tensor([
    [1.0, 0.0], [0.0, 2.0], [0.5, NAN],
    [2.0, 1.0], [NAN, NAN], [0.0, 0.5],
    [1.0, 1.0], [0.25, NAN], [NAN, 3.0],
    [NAN, NAN], [NAN, NAN], [NAN, NAN],
    [NAN, NAN], [4.0, NAN], [NAN, NAN],
])
WEIGHTS = (1.0, 0.5)


def _rewards(per_fn: torch.Tensor, weights=WEIGHTS) -> RewardOutput:
    """What ``RewardRunner.score`` returns: the weighted nansum, NaN where every function is NaN."""
    total = torch.nansum(per_fn * torch.tensor(weights), dim=1)
    total[torch.isnan(per_fn).all(dim=1)] = NAN
    return RewardOutput(per_function=per_fn, total=total, names=["a", "b"])


def _stats(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if not math.isnan(v)]
    n = len(vals)
    mean = sum(vals) / n if n else NAN
    std = (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5 if n > 1 else 0.0  # lone value: 0 (TRL's result)
    return mean, std


def _naive(per_fn: torch.Tensor, s: AdvantageSettings) -> list[float]:
    """The advantages one row at a time, as the docs describe them."""
    rows = per_fn.shape[0]
    total = _rewards(per_fn, s.weights).total.tolist()
    if s.aggregation == "normalize_then_sum":
        summed = []
        for i in range(rows):
            g = i // G
            if all(math.isnan(v) for v in per_fn[i].tolist()):
                summed.append(NAN)
                continue
            acc = 0.0
            for f, w in enumerate(s.weights):
                mean, std = _stats(per_fn[g * G:(g + 1) * G, f].tolist())
                z = (float(per_fn[i, f]) - mean) / (std + EPS)
                acc += w * z if not math.isnan(z) else 0.0
            summed.append(acc)
        mean, std = _stats(summed)
        return [0.0 if math.isnan(v) else (v - mean) / (std + EPS) for v in summed]
    if s.estimator == "gae":
        return total
    _, batch_std = _stats(total)
    out = []
    for i in range(rows):
        r = total[i]
        group = [v for v in total[i // G * G:(i // G + 1) * G] if not math.isnan(v)]
        if math.isnan(r):
            out.append(0.0)
        elif s.estimator == "rloo":
            out.append(r - (sum(group) - r) / (len(group) - 1) if len(group) > 1 else 0.0)
        else:
            mean, std = _stats(group)
            scale = {"group": std + EPS, "batch": batch_std + EPS, "none": 1.0}[s.scale_rewards]
            out.append((r - mean) / scale)
    return out


SETTINGS = [AdvantageSettings(G, "grpo", scale, "sum_then_normalize", WEIGHTS) for scale in ("group", "batch", "none")]
SETTINGS += [AdvantageSettings(G, "rloo", "group", "sum_then_normalize", WEIGHTS),
             AdvantageSettings(G, "grpo", "group", "normalize_then_sum", WEIGHTS),
             AdvantageSettings(G, "gae", "group", "sum_then_normalize", WEIGHTS)]
IDS = ["grpo-group", "grpo-batch", "grpo-none", "rloo", "gdpo", "gae"]


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
def test_one_process_against_a_naive_loop(settings):
    got = compute_advantages(_rewards(PER_FN), settings)
    torch.testing.assert_close(got, torch.tensor(_naive(PER_FN, settings)), equal_nan=True, rtol=1e-5, atol=1e-5)
    if settings.estimator != "gae":
        assert torch.isfinite(got).all()
        assert not got[[4, 9, 10, 11, 12, 14]].any()  # unscorable rows: 0
        if settings.aggregation == "sum_then_normalize":
            assert got[13] == 0  # the only scorable row of its group: no baseline, 0
    else:
        assert torch.isnan(got[[4, 9, 10, 11, 12, 14]]).all()  # the PPO stage masks them out


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
def test_two_ranks_get_what_one_process_with_both_ranks_rows_gets(settings):
    whole = compute_advantages(_rewards(PER_FN), settings)
    parts = [PER_FN[:3 * G], PER_FN[3 * G:]]  # uneven: three groups and two
    got = ThreadRanks(2).run(lambda ranks: compute_advantages(_rewards(parts[ranks.rank]), settings, ranks))
    torch.testing.assert_close(torch.cat(got), whole, equal_nan=True, rtol=1e-5, atol=1e-6)


def test_the_batch_statistics_are_summed_over_the_ranks_only_where_a_setting_needs_them():
    def calls(settings):
        def run(ranks):
            compute_advantages(_rewards(PER_FN[:3 * G] if ranks.rank == 0 else PER_FN[3 * G:]), settings, ranks)
            return ranks.calls
        return ThreadRanks(2).run(run)

    assert calls(AdvantageSettings(G, "grpo", "group")) == [0, 0]  # groups never span ranks
    assert calls(AdvantageSettings(G, "grpo", "batch")) == [1, 1]
    assert calls(AdvantageSettings(G, "grpo", "group", "normalize_then_sum", WEIGHTS)) == [1, 1]


def test_one_process_is_the_default_and_the_result_lands_on_the_device_asked_for():
    s = AdvantageSettings(G, "grpo", "batch")
    got = compute_advantages(_rewards(PER_FN), s, SINGLE, torch.device("cpu"))
    assert torch.equal(compute_advantages(_rewards(PER_FN), s), got) and got.device.type == "cpu"


def test_settings_from_the_config():
    cfg = from_dict({"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": {"functions": ["length"]},
                     "rollout": {"num_generations": 4},
                     "loss": {"advantage_estimator": "rloo", "scale_rewards": "batch"}})
    s = AdvantageSettings.from_config(cfg, [2, 0.5])
    assert s == AdvantageSettings(4, "rloo", "batch", "sum_then_normalize", (2.0, 0.5))
    with pytest.raises(AttributeError):
        s.num_generations = 2  # frozen: read once from the config
