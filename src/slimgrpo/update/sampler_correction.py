"""Samples from another engine (``rollout.engine=vllm``): the mismatch with the training forward, measured every
step, and TRL's truncated importance-sampling correction (``vllm_importance_sampling_correction``).

vLLM's kernels (and a lower ``rollout.vllm_dtype``) give each sampled token a slightly different probability
than the trainer's forward does, so its samples are a little off-policy. The correction weights each token's
policy term by ``w = min(p_train / p_sampler, cap)``, with ``p_train`` the policy's probability before the
update (no gradient). The weight is folded into per-token advantages: every policy term it applies to (the
clipped surrogate of grpo / bnpo / dapo / dr_grpo, PPO's) is linear in the advantage and ``w > 0``, so
``min(r A w, clip(r) A w) = w min(r A, clip(r) A)`` -- the loss TRL computes, with the KL term left unweighted
as there. Validation refuses the loss types where this does not hold (config ``vllm_problem``).
"""

from __future__ import annotations

from typing import Callable

import torch

from slimgrpo.update.batch import UpdateBatch


def truncated_is_weights(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """``min(exp(train - sampler), cap)`` per token [rows, T], 1 off ``mask`` (padding, tool output)."""
    w = torch.exp(train_logp.float() - sampler_logp.float()).clamp(max=cap)
    return torch.where(mask, w, torch.ones_like(w))


def mismatch_metrics(train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor | None, cap: float) -> dict[str, float]:
    """``rollout/logprob_diff_mean`` / ``_max``: |train - sampler| over the sampled tokens; with the correction
    on, the weights' mean and the fraction cut at ``cap``."""
    n = int(mask.sum())
    if n == 0:
        return {}
    diff = (train_logp.float() - sampler_logp.float()).abs()[mask]
    out = {"rollout/logprob_diff_mean": float(diff.mean()), "rollout/logprob_diff_max": float(diff.max())}
    if weights is not None:
        w = weights[mask]
        out["rollout/is_weight_mean"] = float(w.mean())
        out["rollout/is_capped_fraction"] = float((w >= cap).float().mean())
    return out


def correct_for_sampler(batch: UpdateBatch, sampler_logp: torch.Tensor, mask: torch.Tensor, r,
                        train_logprobs: Callable[[], torch.Tensor]) -> dict[str, float]:
    """Measure the sampler's mismatch on this step's rows and, with ``rollout.importance_sampling_correction``,
    scale ``batch.advantages`` per token by the truncated weights (in place). ``r``: the ``rollout`` config
    section; ``train_logprobs``: the policy's log-probs of the batch before the update, computed only when the
    batch has none (``batch.old_logp``). Greedy rollouts (temperature 0) have no sampling distribution to
    correct. Returns the step's metrics."""
    if r.temperature == 0:
        return {}
    train_logp = batch.old_logp if batch.old_logp is not None else train_logprobs()
    sampler_logp = sampler_logp.to(train_logp.device)
    mask = mask.to(train_logp.device)
    weights = None
    if r.importance_sampling_correction:
        weights = truncated_is_weights(train_logp, sampler_logp, mask, r.importance_sampling_cap)
        adv = batch.advantages
        batch.advantages = (adv[:, None] if adv.dim() == 1 else adv) * weights.to(adv.device)
    return mismatch_metrics(train_logp, sampler_logp, mask, weights, r.importance_sampling_cap)
