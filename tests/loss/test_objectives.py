"""The GRPO-family objectives against a plain loop over rows and tokens."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss, sequence_log_ratio

ROWS, T = 4, 6
MAX_LEN = 8

CASES = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "dapo": dict(loss_type="dapo"),
    "dr_grpo": dict(loss_type="dr_grpo", max_completion_length=MAX_LEN),
    "grpo_sequence": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "dapo_sequence": dict(loss_type="dapo", importance_sampling_level="sequence", epsilon=0.05),
    "dr_grpo_sequence": dict(loss_type="dr_grpo", importance_sampling_level="sequence",
                             max_completion_length=MAX_LEN),
    "epsilon_high": dict(loss_type="dapo", epsilon_high=0.28),
    "delta": dict(loss_type="bnpo", delta=1.5),
    "beta": dict(loss_type="grpo", beta=0.04),
    "everything": dict(loss_type="dapo", epsilon=0.1, epsilon_high=0.3, delta=1.6, beta=0.1),
    "everything_sequence": dict(loss_type="grpo", importance_sampling_level="sequence",
                                epsilon=0.1, epsilon_high=0.3, delta=1.6, beta=0.1),
    "beta_no_bias_correction": dict(loss_type="dapo", beta=0.1, use_bias_correction_kl=False),
    "beta_sequence_no_bias_correction": dict(loss_type="grpo", importance_sampling_level="sequence",
                                             beta=0.1, use_bias_correction_kl=False),
    "luspo": dict(loss_type="luspo"),
    "luspo_sequence": dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.05),
}


def _example(seed=0):
    """log-probs with ratios spread over ~[0.4, 2.5], mixed-sign advantages, ragged masks."""
    g = torch.Generator().manual_seed(seed)
    logp = (-2.0 + 0.5 * torch.randn(ROWS, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.45 * torch.randn(ROWS, T, generator=g)
    ref = logp.detach() + 0.3 * torch.randn(ROWS, T, generator=g)
    advantages = torch.tensor([1.3, -0.7, -0.4, 1.1])
    lengths = torch.tensor([6, 3, 5, 1])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [rows, T]
    return logp, old, ref, advantages, mask


def _naive_loss(logp, old, ref, advantages, mask, s: LossSettings, norm: Normaliser):
    """The objective written out token by token (module docstring of objectives.py)."""
    eps_low = s.epsilon
    eps_high = s.epsilon if s.epsilon_high is None else s.epsilon_high
    total = torch.zeros(())
    kls, lows, highs = [], [], []
    for i in range(logp.shape[0]):
        tokens = [t for t in range(logp.shape[1]) if mask[i, t]]
        seq_log_ratio = sum(logp[i, t] - old[i, t] for t in tokens) / len(tokens)
        adv = float(advantages[i])
        row = torch.zeros(())
        for t in tokens:
            if s.importance_sampling_level == "token":
                r = torch.exp(logp[i, t] - old[i, t])
            else:  # GSPO-token: value s_i, gradient s_i * d logp_it
                r = torch.exp(seq_log_ratio.detach() + logp[i, t] - logp[i, t].detach())
            capped = r if s.delta is None else min(r, torch.tensor(s.delta))
            clipped = min(max(r, torch.tensor(1 - eps_low)), torch.tensor(1 + eps_high))
            term = -min(capped * adv, clipped * adv)
            d = ref[i, t] - logp[i, t]
            kl = torch.exp(d) - d - 1
            if s.use_bias_correction_kl:  # times the ratio; at sequence level the plain s_i
                kl = kl * (torch.exp(logp[i, t] - old[i, t]) if s.importance_sampling_level == "token"
                           else torch.exp(seq_log_ratio))
            if s.beta > 0:
                term = term + s.beta * kl
            row = row + term
            kls.append(float(kl.detach()))
            lows.append(float(r.detach()) < 1 - eps_low and adv < 0)
            highs.append(float(r.detach()) > 1 + eps_high and adv > 0)
        if s.loss_type == "grpo":
            total = total + row / len(tokens) / norm.num_sequences
        elif s.loss_type in ("bnpo", "dapo"):
            total = total + row / norm.num_tokens
        elif s.loss_type == "luspo":
            total = total + row / norm.num_sequences
        else:
            total = total + row / (norm.num_sequences * s.max_completion_length)
    n = len(kls)
    stats = dict(kl=sum(kls) / n, clip_ratio_low=sum(lows) / n, clip_ratio_high=sum(highs) / n,
                 clip_ratio_region=(sum(lows) + sum(highs)) / n)
    if s.importance_sampling_level == "sequence":  # one clip flag per sequence (TRL logs them so)
        starts = [0] + list(itertools.accumulate(int(mask[i].sum()) for i in range(logp.shape[0])))
        per_seq = lambda flags: sum(flags[a] for a in starts[:-1]) / (len(starts) - 1)  # noqa: E731
        stats.update(clip_ratio_low=per_seq(lows), clip_ratio_high=per_seq(highs),
                     clip_ratio_region=per_seq([a or b for a, b in zip(lows, highs)]))
    return total, stats


@pytest.mark.parametrize("case", list(CASES))
def test_matches_naive_loop(case):
    settings = LossSettings(**CASES[case])
    logp, old, ref, advantages, mask = _example()
    norm = Normaliser.of(mask)
    loss, stats = grpo_loss(logp, old, ref, advantages, mask, settings, norm)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_loss, ref_stats = _naive_loss(logp, old, ref, advantages, mask, settings, norm)
    (ref_grad,) = torch.autograd.grad(ref_loss, logp)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    assert (grad[~mask] == 0).all()
    for name, value in ref_stats.items():
        assert math.isclose(getattr(stats, name), value, rel_tol=1e-5, abs_tol=1e-6), name
    assert stats.entropy == 0.0  # filled by the trainer


def test_example_exercises_clipping():
    """Guard on the fixture: both clip sides fire, so the comparisons above mean something."""
    logp, old, ref, advantages, mask = _example()
    _, stats = grpo_loss(logp, old, ref, advantages, mask, LossSettings(), Normaliser.of(mask))
    assert stats.clip_ratio_low > 0 and stats.clip_ratio_high > 0
    assert stats.clip_ratio_region == pytest.approx(stats.clip_ratio_low + stats.clip_ratio_high)
    norm = Normaliser.of(mask)
    plain, _ = grpo_loss(logp, old, ref, advantages, mask, LossSettings(), norm)
    capped, _ = grpo_loss(logp, old, ref, advantages, mask, LossSettings(delta=1.5), norm)
    assert capped < plain  # some negative-advantage token has a ratio above delta


@pytest.mark.parametrize("case", ["grpo", "dapo", "dr_grpo_sequence", "everything_sequence", "luspo"])
def test_micro_batches_sum_to_batch(case):
    """Two micro-batches with the whole-batch normaliser give the full batch's loss and grad."""
    settings = LossSettings(**CASES[case])
    logp, old, ref, advantages, mask = _example(seed=1)
    norm = Normaliser.of(mask)
    full, _ = grpo_loss(logp, old, ref, advantages, mask, settings, norm)
    (full_grad,) = torch.autograd.grad(full, logp)
    parts = [slice(0, 1), slice(1, ROWS)]  # unequal sizes on purpose
    total = sum(grpo_loss(logp[p], old[p], ref[p], advantages[p], mask[p], settings, norm)[0]
                for p in parts)
    (split_grad,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(split_grad, full_grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_without_old_logp_ratio_is_one(level):
    """One update per batch: old = logp.detach(), no clipping, gradient -A / normaliser."""
    settings = LossSettings(loss_type="dapo", importance_sampling_level=level)
    logp, _, _, advantages, mask = _example()
    norm = Normaliser.of(mask)
    loss, stats = grpo_loss(logp, None, None, advantages, mask, settings, norm)
    (grad,) = torch.autograd.grad(loss, logp)
    expected_loss = -(advantages[:, None] * mask).sum() / norm.num_tokens
    torch.testing.assert_close(loss, expected_loss)
    torch.testing.assert_close(grad, -advantages[:, None] * mask / norm.num_tokens)
    assert stats.clip_ratio_region == 0.0 and stats.kl == 0.0


def test_sequence_log_ratio_value_and_gradient():
    """GSPO-token: the value is the row's mean log-ratio on every token, the gradient is 1."""
    logp, old, _, _, mask = _example()
    log_ratio = sequence_log_ratio(logp, old, mask)  # [rows, T]
    for i in range(ROWS):
        n = int(mask[i].sum())
        mean = float((logp.detach() - old)[i, :n].sum()) / n
        torch.testing.assert_close(log_ratio[i, :n], torch.full((n,), mean))
    (grad,) = torch.autograd.grad(log_ratio.sum(), logp)
    torch.testing.assert_close(grad, torch.ones_like(grad))


def test_settings_validation():
    with pytest.raises(ValueError, match="loss_type"):
        LossSettings(loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        LossSettings(importance_sampling_level="tokens")
    with pytest.raises(ValueError, match="max_completion_length"):
        LossSettings(loss_type="dr_grpo")
    with pytest.raises(ValueError, match="delta"):
        LossSettings(delta=0.9)
    with pytest.raises(ValueError, match="epsilon"):
        LossSettings(epsilon=1.5)
    with pytest.raises(ValueError, match="beta"):
        LossSettings(beta=-0.1)
    assert LossSettings(epsilon=0.2).upper_epsilon == 0.2
    assert LossSettings(epsilon=0.2, epsilon_high=0.28).upper_epsilon == 0.28
    with pytest.raises(ValueError, match="Normaliser"):
        Normaliser(num_sequences=0, num_tokens=3)


def test_bad_inputs_raise():
    logp, old, ref, advantages, mask = _example()
    norm = Normaliser.of(mask)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, None, advantages, mask, LossSettings(beta=0.1), norm)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, old, ref, advantages[:-1], mask, LossSettings(), norm)
    with pytest.raises(ValueError, match="old_logp"):
        grpo_loss(logp, old[:, :-1], ref, advantages, mask, LossSettings(), norm)
