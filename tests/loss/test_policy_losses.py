"""TRL 1.16's newer loss types and token masks against token-by-token loops (equations in
src/slimgrpo/loss/policy_losses.py)."""

from __future__ import annotations

import math

import pytest
import torch

from slimgrpo.loss.objectives import LossSettings, Normaliser, TokenEntropy, grpo_loss
from slimgrpo.loss.policy_losses import entropy_threshold

from _loss_example import ROWS, T
from _loss_example import example as _example


def _tokens(mask, i):
    return [t for t in range(mask.shape[1]) if mask[i, t]]


def _ratio(logp, old, mask, i, t, level):
    if level == "token":
        return torch.exp(logp[i, t] - old[i, t])
    toks = _tokens(mask, i)
    seq = sum(logp[i, u] - old[i, u] for u in toks) / len(toks)
    return torch.exp(seq.detach() + logp[i, t] - logp[i, t].detach())


def _naive(logp, old, ref, adv, mask, entropy, s: LossSettings, norm: Normaliser, cut=None):
    """Per-token policy term, masks, bias-corrected KL, aggregation: a loop over rows and tokens."""
    eps_high = s.epsilon if s.epsilon_high is None else s.epsilon_high
    if s.top_entropy_quantile < 1.0 and cut is None:
        vals = sorted(float(entropy[i, t]) for i in range(ROWS) for t in _tokens(mask, i))
        pos = (1.0 - s.top_entropy_quantile) * (len(vals) - 1)  # linear interpolation
        lo = math.floor(pos)
        cut = vals[lo] + (vals[min(lo + 1, len(vals) - 1)] - vals[lo]) * (pos - lo)
    total = torch.zeros(())
    for i in range(ROWS):
        toks = _tokens(mask, i)
        a = float(adv[i])
        keep_row = True
        if s.off_policy_mask_threshold is not None:
            mean_kl = sum(float(old[i, t] - logp[i, t].detach()) for t in toks) / len(toks)
            keep_row = a >= 0 or mean_kl <= s.off_policy_mask_threshold
        log_w = sum(max(min(float(logp[i, t].detach() - old[i, t]), 20.0), -20.0) for t in toks)
        log_w = max(min(log_w, 20.0), math.log(1e-8))
        k, lam = ((s.vespo_k_pos, s.vespo_lambda_pos) if a >= 0 else (s.vespo_k_neg, s.vespo_lambda_neg))
        phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        row = torch.zeros(())
        for t in toks:
            r = _ratio(logp, old, mask, i, t, s.importance_sampling_level)
            if s.loss_type == "cispo":
                term = -float(min(r.detach(), torch.tensor(eps_high))) * a * logp[i, t]
            elif s.loss_type == "sapo":
                tau = s.sapo_temperature_pos if a > 0 else s.sapo_temperature_neg
                term = -4.0 / tau * torch.sigmoid(tau * (r - 1.0)) * a
            elif s.loss_type == "vespo":
                term = -phi * a * logp[i, t]
            else:
                clipped = min(max(r, torch.tensor(1 - s.epsilon)), torch.tensor(1 + eps_high))
                term = -min(r * a, clipped * a)
            if not keep_row:
                term = term * 0.0
            if s.top_entropy_quantile < 1.0 and not float(entropy[i, t]) >= cut:
                term = term * 0.0
            if s.beta > 0:
                d = ref[i, t] - logp[i, t]
                kl = torch.exp(d) - d - 1
                if s.use_bias_correction_kl:
                    kl = kl * torch.exp(logp[i, t] - old[i, t])
                term = term + s.beta * kl
            row = row + term
        if s.loss_type in ("sapo", "grpo"):
            total = total + row / len(toks) / norm.num_sequences
        else:  # cispo, vespo, dapo: tokens of the whole batch
            total = total + row / norm.num_tokens
    return total


CASES = {
    "cispo": dict(loss_type="cispo", epsilon_high=1.2),
    "cispo_beta": dict(loss_type="cispo", epsilon_high=5.0, beta=0.05),
    "sapo": dict(loss_type="sapo"),
    "sapo_sequence": dict(loss_type="sapo", importance_sampling_level="sequence",
                          sapo_temperature_pos=0.8, sapo_temperature_neg=1.3),
    "vespo": dict(loss_type="vespo"),
    "vespo_params": dict(loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=0.5, vespo_k_neg=4.0,
                         vespo_lambda_neg=1.5, beta=0.02),
    "off_policy_mask": dict(loss_type="dapo", off_policy_mask_threshold=0.05),
    "off_policy_mask_cispo": dict(loss_type="cispo", epsilon_high=5.0, off_policy_mask_threshold=0.05),
    "top_entropy": dict(loss_type="dapo", top_entropy_quantile=0.3),
    "top_entropy_zero": dict(loss_type="grpo", top_entropy_quantile=0.0, beta=0.1),
    "everything": dict(loss_type="sapo", top_entropy_quantile=0.6, off_policy_mask_threshold=0.02,
                       beta=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_token_loop(case):
    s = LossSettings(**CASES[case])
    logp, old, ref, adv, mask, ent = _example()
    norm = Normaliser.of(mask)
    loss, _ = grpo_loss(logp, old, ref, adv, mask, s, norm, entropy=TokenEntropy(ent))
    (grad,) = torch.autograd.grad(loss, logp)
    want = _naive(logp, old, ref, adv, mask, ent, s, norm)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-6, atol=1e-6)
    assert (grad[~mask] == 0).all()


def test_masks_and_caps_fire_on_the_example():
    """Guards on the fixture: each switch changes the loss, so the comparisons above mean something."""
    logp, old, ref, adv, mask, ent = _example()
    norm = Normaliser.of(mask)

    def value(**kw):
        return float(grpo_loss(logp, old, ref, adv, mask, LossSettings(**kw), norm, entropy=TokenEntropy(ent))[0].detach())

    assert value(loss_type="cispo", epsilon_high=1.2) != value(loss_type="cispo", epsilon_high=50.0)
    assert value(off_policy_mask_threshold=0.05) != value()
    assert value(top_entropy_quantile=0.3) != value()
    assert value(beta=0.1) != value(beta=0.1, use_bias_correction_kl=False)


def test_top_entropy_quantile_edges():
    logp, old, ref, adv, mask, ent = _example()
    # rho = 0 keeps only the highest-entropy token; rho = 1 keeps all
    cut = entropy_threshold(ent, mask, 0.0)
    assert float(cut) == float(ent[mask].max())
    assert float(entropy_threshold(ent, mask, 1.0)) == float(ent[mask].min())
    assert entropy_threshold(ent, torch.zeros_like(mask), 0.5) is None


def test_top_entropy_batch_threshold_makes_micro_batches_sum():
    """With the whole batch's threshold passed in, micro-batch losses add up to the batch loss."""
    s = LossSettings(loss_type="dapo", top_entropy_quantile=0.4)
    logp, old, ref, adv, mask, ent = _example(seed=3)
    norm = Normaliser.of(mask)
    cut = entropy_threshold(ent, mask, 0.4)
    full, _ = grpo_loss(logp, old, ref, adv, mask, s, norm, entropy=TokenEntropy(ent, cut=cut))
    parts = [slice(0, 2), slice(2, ROWS)]
    total = sum(grpo_loss(logp[p], old[p], ref[p], adv[p], mask[p], s, norm,
                          entropy=TokenEntropy(ent[p], cut=cut))[0] for p in parts)
    torch.testing.assert_close(total, full)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(logp, old, ref, adv, mask, s, norm)


def test_bias_correction_changes_the_on_policy_gradient():
    """On-policy the corrected KL term has value k3 but gradient d k3 + k3 (TRL's documented effect)."""
    logp, _, ref, adv, mask, _ = _example()
    norm = Normaliser.of(mask)
    zero = torch.zeros_like(adv)
    s = LossSettings(beta=1.0)
    loss, _ = grpo_loss(logp, None, ref, zero, mask, s, norm)
    (grad,) = torch.autograd.grad(loss, logp)
    d = ref - logp.detach()
    k3 = torch.exp(d) - d - 1
    dk3 = 1.0 - torch.exp(d)  # d k3 / d logp
    torch.testing.assert_close(loss, (k3 * mask).sum() / norm.num_tokens)
    torch.testing.assert_close(grad, (dk3 + k3) * mask / norm.num_tokens)


def test_clip_stats_per_sequence_and_extras():
    logp, old, ref, adv, mask, ent = _example()
    norm = Normaliser.of(mask)
    _, st = grpo_loss(logp, old, ref, adv, mask, LossSettings(importance_sampling_level="sequence",
                                                              epsilon=0.05), norm)
    assert st.clip_count == ROWS  # one flag per sequence
    seq = torch.exp(((logp.detach() - old) * mask).sum(1) / mask.sum(1))
    low = ((seq < 0.95) & (adv < 0)).float().mean()
    high = ((seq > 1.05) & (adv > 0)).float().mean()
    assert st.clip_ratio_low == pytest.approx(float(low)) and st.clip_ratio_high == pytest.approx(float(high))
    assert st.clip_ratio_low + st.clip_ratio_high > 0
    _, st = grpo_loss(logp, old, ref, adv, mask, LossSettings(loss_type="cispo", epsilon_high=1.2), norm)
    r = torch.exp(logp.detach() - old)
    want = float((((r > 1.2) & (adv[:, None] > 0)) & mask).sum() / mask.sum())
    assert st.extra["cispo_clip_ratio"] == pytest.approx(want) and st.clip_count == int(mask.sum())
    _, st = grpo_loss(logp, old, ref, adv, mask, LossSettings(loss_type="vespo"), norm)
    assert 0 < st.extra["vespo/phi_seq_mean"] and st.clip_count == ROWS


def test_new_settings_validation():
    for kw, word in [(dict(sapo_temperature_pos=0.0), "sapo_temperature_pos"),
                     (dict(vespo_lambda_neg=-1.0), "vespo_lambda_neg"),
                     (dict(vespo_k_pos=-1.0), "vespo_k_pos"),
                     (dict(off_policy_mask_threshold=0.0), "off_policy_mask_threshold"),
                     (dict(top_entropy_quantile=1.5), "top_entropy_quantile")]:
        with pytest.raises(ValueError, match=word):
            LossSettings(**kw)
