import pytest
import torch

from slimgrpo.advantage.compute import AdvantageSettings, compute_advantages
from slimgrpo.advantage.estimators import EPS, grpo_advantages, rloo_advantages, zero_std_fraction
from slimgrpo.containers import RewardOutput

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4


def test_group_scaling_by_hand():
    a = grpo_advantages(REWARDS, 4, "group")
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # 0.57735 (unbiased)
    expected = [(1 - 0.5) / (std + EPS), -0.5 / (std + EPS), -0.5 / (std + EPS), 0.5 / (std + EPS), 0, 0, 0, 0]
    assert torch.allclose(a, torch.tensor(expected), atol=1e-6)


def test_batch_and_no_scaling():
    none = grpo_advantages(REWARDS, 4, "none")
    assert none.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    batch = grpo_advantages(REWARDS, 4, "batch")
    assert torch.allclose(batch, none / (REWARDS.std() + EPS))


def test_rloo_leave_one_out_by_hand():
    a = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 3.0]), 4)
    # r_i - mean of the other three
    assert torch.allclose(a, torch.tensor([1 - 1.0, 0 - 4 / 3, 0 - 4 / 3, 3 - 1 / 3]))


def test_dispatch_and_errors():
    rewards = RewardOutput(per_function=REWARDS[:, None], total=REWARDS, names=["r"])
    assert torch.equal(compute_advantages(rewards, AdvantageSettings(4, "rloo")), rloo_advantages(REWARDS, 4))
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_advantages(REWARDS, 3)
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo_advantages(REWARDS, 4, "bogus")


def test_zero_std_fraction():
    assert zero_std_fraction(REWARDS, 4) == 0.5


# --- unscorable rows (every reward function returned None): NaN, left out, advantage 0 (TRL 1.16) ---

NAN = float("nan")
WITH_NAN = torch.tensor([1.0, NAN, 0.0, 3.0, NAN, 2.0, 5.0, 2.5, 7.0, NAN, NAN, NAN])  # 3 groups of 4


def _loop_stats(values):
    vals = [v for v in values if v == v]
    n = len(vals)
    mean = sum(vals) / n if n else float("nan")
    std = (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5 if n > 1 else float("nan")
    return mean, std


def _loop_grpo(rewards, G, scale):
    out, flat = [], rewards.tolist()
    _, batch_std = _loop_stats(flat)
    for g in range(len(flat) // G):
        group = flat[g * G:(g + 1) * G]
        mean, std = _loop_stats(group)
        for r in group:
            a = r - mean
            if scale == "group":
                a = a / (std + EPS)
            elif scale == "batch":
                a = a / (batch_std + EPS)
            out.append(0.0 if a != a else a)
    return torch.tensor(out)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_unscorable_rows_left_out_of_baseline(scale):
    got = grpo_advantages(WITH_NAN, 4, scale)
    torch.testing.assert_close(got, _loop_grpo(WITH_NAN, 4, scale))
    assert got[1] == 0 and got[4] == 0 and (got[8:] == 0).all()  # unscorable, or alone in its group
    # the scorable rows of group 0 are normalised among themselves: their mean is 0
    assert abs(float(got[[0, 2, 3]].sum())) < 1e-5


def test_unscorable_rows_rloo():
    got = rloo_advantages(WITH_NAN, 4)
    flat, want = WITH_NAN.tolist(), []
    for g in range(3):
        group = flat[g * 4:(g + 1) * 4]
        ok = [v for v in group if v == v]
        for r in group:
            if r != r or len(ok) < 2:
                want.append(0.0)
            else:
                want.append(r - (sum(ok) - r) / (len(ok) - 1))
    torch.testing.assert_close(got, torch.tensor(want))


def test_normalize_then_sum_matches_loop():
    from slimgrpo.advantage.estimators import batch_normalised, normalize_then_sum

    per_fn = torch.tensor([[1.0, 0.0], [0.0, NAN], [1.0, 1.0], [NAN, NAN],
                           [0.5, 2.0], [0.25, 2.0], [1.0, NAN], [0.0, 4.0]])
    w = torch.tensor([1.0, 0.5])
    got = normalize_then_sum(per_fn, w, 4)
    want = []
    for i in range(8):
        g = i // 4
        if all(v != v for v in per_fn[i].tolist()):
            want.append(NAN)
            continue
        total = 0.0
        for f in range(2):
            mean, std = _loop_stats(per_fn[g * 4:(g + 1) * 4, f].tolist())
            z = (float(per_fn[i, f]) - mean) / (std + EPS)
            total += float(w[f]) * z if z == z else 0.0
        want.append(total)
    torch.testing.assert_close(got, torch.tensor(want), equal_nan=True)
    adv = batch_normalised(got)
    mean, std = _loop_stats(want)
    torch.testing.assert_close(adv, torch.tensor([0.0 if v != v else (v - mean) / (std + EPS) for v in want]))


def test_global_nan_moments_one_process():
    from slimgrpo.advantage.estimators import global_nan_moments, nanstd

    mean, std = global_nan_moments(WITH_NAN)
    ref_mean, ref_std = _loop_stats(WITH_NAN.tolist())
    assert float(mean) == pytest.approx(ref_mean) and float(std) == pytest.approx(ref_std, rel=1e-5)
    assert float(nanstd(WITH_NAN)) == pytest.approx(ref_std, rel=1e-5)
