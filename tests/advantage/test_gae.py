"""PPO's per-token advantages (``advantage/gae.py``): ``ppo_advantages`` against a naive loop (ragged rows,
T = 7, an unscorable row, a row with no tokens, tokens masked inside a row), and the statistics that span
rows (whitening, explained variance, the value metrics) on two ranks (threads with a fake ``Collectives``)
against one process that holds both ranks' rows. The step's pieces alone (``gae``, ``token_rewards``,
``masked_whiten``) are checked against loops in tests/update/test_ppo.py."""

from __future__ import annotations

import math

import pytest
import torch

from fake_ranks import ThreadRanks
from slimgrpo.advantage.gae import (PPOSettings, explained_variance, masked_whiten, ppo_advantages, scorable_mask,
                                    value_metrics)

NAN = float("nan")
T = 7


def _batch(seed: int = 0):
    """Six rows: lengths 7, 3, 0, 5, 1, 6; row 0 has masked tokens inside (tool results); row 3 is unscorable."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[0, 2] = mask[0, 3] = False
    scores = torch.randn(6, generator=g)
    scores[3] = NAN
    values = torch.randn(6, T, generator=g)
    old, ref = torch.randn(6, T, generator=g), torch.randn(6, T, generator=g)
    return scores, values, mask, old, ref


def _whiten(x: list[list[float]], m: list[list[bool]], shift_mean: bool) -> list[list[float]]:
    vals = [v for row, mr in zip(x, m) for v, k in zip(row, mr) if k]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return [[((v - mean) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)) if k else 0.0
             for v, k in zip(row, mr)] for row, mr in zip(x, m)]


def _naive(scores, values, mask, old, ref, s: PPOSettings):
    """Token by token: the reward, whitening, GAE over each row's masked tokens, the row means."""
    rows = scores.shape[0]
    m = [[bool(mask[i, t]) and not math.isnan(float(scores[i])) for t in range(T)] for i in range(rows)]
    r = [[-s.kl_coef * float(old[i, t] - ref[i, t]) if m[i][t] else 0.0 for t in range(T)] for i in range(rows)]
    for i in range(rows):
        steps = [t for t in range(T) if m[i][t]]
        if steps:
            r[i][steps[-1]] += float(scores[i])
    if s.whiten_rewards:
        r = _whiten(r, m, shift_mean=False)
    A = [[0.0] * T for _ in range(rows)]
    R = [[0.0] * T for _ in range(rows)]
    for i in range(rows):
        steps = [t for t in range(T) if m[i][t]]
        running = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = float(values[i, steps[k + 1]]) if k + 1 < len(steps) else 0.0
            running = r[i][t] + s.gamma * next_v - float(values[i, t]) + s.gamma * s.lam * running
            A[i][t] = running
            R[i][t] = running + float(values[i, t])
    if s.whiten_advantages:
        A = [[v for v in row] for row in _whiten(A, m, shift_mean=True)]
    row_mean = [sum(a for a, k in zip(A[i], m[i]) if k) / max(sum(m[i]), 1) for i in range(rows)]
    return torch.tensor(m), torch.tensor(A), torch.tensor(R), torch.tensor(row_mean)


SETTINGS = [PPOSettings(1.0, 0.95, 0.05, False, True), PPOSettings(0.9, 0.5, 0.0, True, False),
            PPOSettings(0.99, 0.0, 0.1, True, True)]


@pytest.mark.parametrize("s", SETTINGS, ids=["default", "whiten-rewards", "both"])
def test_ppo_advantages_against_a_naive_loop(s):
    scores, values, mask, old, ref = _batch()
    got = ppo_advantages(scores, values, mask, old, ref, s)
    want_m, want_a, want_r, want_mean = _naive(scores, values, mask, old, ref, s)
    assert torch.equal(got.mask, want_m) and not got.mask[3].any()  # the unscorable row leaves the loss
    torch.testing.assert_close(got.advantages, want_a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.returns, want_r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.row_mean, want_mean, rtol=1e-4, atol=1e-5)
    assert got.row_mean[2] == 0 and got.row_mean[3] == 0  # no tokens; unscorable
    assert ("ppo/kl_penalty" in got.metrics) == bool(s.kl_coef)
    kl = sum(s.kl_coef * float(old[i, t] - ref[i, t]) for i in range(6) for t in range(T) if want_m[i, t])
    if s.kl_coef:
        assert got.metrics["ppo/kl_penalty"] == pytest.approx(kl / int(want_m.sum()), rel=1e-5)
    v = values[want_m].double()
    assert got.metrics["value/mean"] == pytest.approx(float(v.mean()), rel=1e-5)
    assert got.metrics["value/returns_mean"] == pytest.approx(float(want_r[want_m].double().mean()), rel=1e-4)


def test_no_kl_penalty_without_a_reference():
    scores, values, mask, old, _ = _batch()
    got = ppo_advantages(scores, values, mask, old, None, PPOSettings(kl_coef=0.0))
    assert "ppo/kl_penalty" not in got.metrics


def test_scorable_mask():
    mask = torch.ones(3, 2, dtype=torch.bool)
    assert scorable_mask(mask, torch.tensor([1.0, NAN, 0.0])).tolist() == [[True, True], [False, False], [True, True]]


def _two_ranks(fn, split: int = 2):
    """``fn(ranks, rows)`` on two ranks (rows [:split] and [split:], an uneven cut) and on one process."""
    from slimgrpo.collectives import SINGLE

    batch = _batch(seed=4)
    parts = [tuple(x[:split] for x in batch), tuple(x[split:] for x in batch)]
    on_ranks = ThreadRanks(2).run(lambda ranks: fn(ranks, parts[ranks.rank]))
    return on_ranks, fn(SINGLE, batch)


@pytest.mark.parametrize("s", SETTINGS, ids=["default", "whiten-rewards", "both"])
def test_ppo_advantages_on_two_ranks_are_one_process_with_both_ranks_rows(s):
    on_ranks, whole = _two_ranks(lambda ranks, b: ppo_advantages(*b, s, ranks))
    torch.testing.assert_close(torch.cat([p.advantages for p in on_ranks]), whole.advantages, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([p.returns for p in on_ranks]), whole.returns, rtol=1e-5, atol=1e-6)
    for part in on_ranks:  # the metrics are the job's, the same on every rank
        assert part.metrics.keys() == whole.metrics.keys()
        for k, v in whole.metrics.items():
            assert part.metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_on_two_ranks(shift_mean):
    def whiten(ranks, b):
        _, values, mask, _, _ = b
        return masked_whiten(values, mask, shift_mean, ranks=ranks)

    on_ranks, whole = _two_ranks(whiten, split=3)
    torch.testing.assert_close(torch.cat(on_ranks), whole, rtol=1e-5, atol=1e-6)


def test_explained_variance_and_value_metrics_on_two_ranks():
    def ev(ranks, b):
        scores, values, mask, old, ref = b
        returns = values + 0.3 * old
        return (explained_variance(values, returns, mask, ranks),
                value_metrics(values, returns, mask, (old * mask).sum(), ranks))

    on_ranks, whole = _two_ranks(ev, split=1)
    for e, metrics in on_ranks:
        assert e == pytest.approx(whole[0], rel=1e-6)
        assert metrics == pytest.approx(whole[1], rel=1e-6)
    assert 0 < whole[0] < 1


def test_settings_from_the_loss_config():
    from slimgrpo.config import LossConfig

    L = LossConfig(advantage_estimator="gae", gamma=0.9, lam=0.8, kl_coef=0.0, whiten_rewards=True)
    assert PPOSettings.from_config(L) == PPOSettings(0.9, 0.8, 0.0, True, True)
    assert PPOSettings.from_config(LossConfig()) == PPOSettings()  # the defaults are the config's
