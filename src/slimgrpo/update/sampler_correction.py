"""Samples from another engine (``rollout.engine=vllm``): the mismatch with the training forward, measured every
step, and TRL 1.16's importance-sampling correction (``vllm_importance_sampling_correction`` with its four
``vllm_importance_sampling_mode``s).

vLLM's kernels (and a lower ``rollout.vllm_dtype``) give each sampled token a slightly different probability
than the trainer's forward does, so its samples are a little off-policy. The correction weights each token's
policy term by ``w``, from the ratio ``rho = p_train / p_sampler`` (``p_train``: the policy's probability before
the update, no gradient), per token or, for the ``sequence_*`` modes, one ratio per completion (the product over
its sampled tokens, applied to all of them). ``*_truncate`` clamps ``rho`` into ``[min, cap]``; ``*_mask`` sets
``w = 0`` where ``rho`` falls outside ``[min, cap]`` and ``w = rho`` elsewhere (a missing bound is no bound).
TRL 1.16's default is ``sequence_mask`` with cap 3 and no lower bound.

The weight is folded into per-token advantages: every policy term it applies to (the clipped surrogate of
grpo / bnpo / dapo / dr_grpo, PPO's) is linear in the advantage and ``w >= 0``, so ``min(r A w, clip(r) A w) =
w min(r A, clip(r) A)`` -- the loss TRL computes, with the KL term left unweighted as there. Validation refuses
the loss types where this does not hold (config ``vllm_problem``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from slimgrpo.config.sections.rollout import IMPORTANCE_SAMPLING_MODES as MODES
from slimgrpo.update.batch import UpdateBatch


def is_ratios(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
              sequence: bool) -> torch.Tensor:
    """``p_train / p_sampler`` per token [rows, T], or per row [rows, 1] (``sequence``: the exponent is the sum of
    the row's differences on ``mask``). A token the sampler gave no log-prob (NaN) counts as no difference."""
    diff = torch.nan_to_num(train_logp.float() - sampler_logp.float(), nan=0.0) * mask
    if sequence:
        diff = diff.sum(dim=-1, keepdim=True)
    return torch.exp(diff)


def is_weights(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, mode: str,
               cap: float | None, floor: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights of ``mode`` (module docstring) per token [rows, T] (1 off ``mask``: padding, tool output) and
    which ratios fell outside ``[floor, cap]`` (per token or per row, as the mode counts them)."""
    if mode not in MODES:
        raise ValueError(f"importance sampling mode {mode!r}: one of {', '.join(MODES)}")
    ratio = is_ratios(train_logp, sampler_logp, mask, sequence=mode.startswith("sequence"))
    low = -math.inf if floor is None else floor
    high = math.inf if cap is None else cap
    outside = (ratio < low) | (ratio > high)
    w = ratio.clamp(min=floor, max=cap) if mode.endswith("truncate") else ratio.masked_fill(outside, 0.0)
    w = w.expand_as(train_logp)
    return torch.where(mask, w, torch.ones_like(w)), outside


def mismatch_metrics(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor | None, outside: torch.Tensor | None = None,
                     sequence: bool = False) -> dict[str, float]:
    """``rollout/logprob_diff_mean`` / ``_max``: |train - sampler| over the sampled tokens (NaN ones left out);
    with the correction on, the weights' mean / min / max (over tokens, or over rows for ``sequence`` modes, as
    TRL logs ``sampling/importance_sampling_ratio/*``) and ``rollout/is_capped_fraction``, the fraction of ratios
    outside the bounds (truncated or masked)."""
    n = int(mask.sum())
    if n == 0:
        return {}
    diff = (train_logp.float() - sampler_logp.float()).abs()[mask]
    diff = diff[~torch.isnan(diff)]
    out = {}
    if diff.numel():
        out = {"rollout/logprob_diff_mean": float(diff.mean()), "rollout/logprob_diff_max": float(diff.max())}
    if weights is not None:
        rows = mask.any(dim=-1)
        w = weights[:, :1][rows] if sequence else weights[mask]
        out.update({"rollout/is_weight_mean": float(w.mean()), "rollout/is_weight_min": float(w.min()),
                    "rollout/is_weight_max": float(w.max())})
        if outside is not None:
            cut = outside[rows] if sequence else outside.expand_as(mask)[mask]
            out["rollout/is_capped_fraction"] = float(cut.float().mean())
    return out


def correct_for_sampler(batch: UpdateBatch, sampler_logp: torch.Tensor, mask: torch.Tensor, r,
                        train_logprobs: Callable[[], torch.Tensor]) -> tuple[UpdateBatch, dict[str, float]]:
    """Measure the sampler's mismatch on this step's rows and, with ``rollout.importance_sampling_correction``,
    scale the advantages per token by the weights of ``rollout.importance_sampling_mode``. ``r``: the ``rollout``
    config section; ``train_logprobs``: the policy's log-probs of the batch before the update, computed only when
    the batch has none (``batch.old_logp``). Greedy rollouts (temperature 0) have no sampling distribution to
    correct. Returns the batch (a new one where the advantages changed) and the step's metrics."""
    if r.temperature == 0:
        return batch, {}
    train_logp = batch.old_logp if batch.old_logp is not None else train_logprobs()
    sampler_logp = sampler_logp.to(train_logp.device)
    mask = mask.to(train_logp.device)
    weights = outside = None
    sequence = r.importance_sampling_mode.startswith("sequence")
    if r.importance_sampling_correction:
        weights, outside = is_weights(train_logp, sampler_logp, mask, r.importance_sampling_mode,
                                      r.importance_sampling_cap, r.importance_sampling_min)
        adv = batch.advantages
        batch = dataclasses.replace(batch, advantages=(adv[:, None] if adv.dim() == 1 else adv) * weights.to(adv.device))
    return batch, mismatch_metrics(train_logp, sampler_logp, mask, weights, outside, sequence)
