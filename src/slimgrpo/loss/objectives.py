"""The GRPO family of policy-gradient objectives, as small pure tensor functions.

For completion ``i`` with tokens ``t`` (mask ``m_it``, length ``|o_i| = sum_t m_it``), policy
log-probs ``logp_it``, sampling-time ("old") log-probs ``old_it``, reference log-probs ``ref_it``
and advantage ``A_i`` (group-normalised rewards, or RLOO leave-one-out baselines, Ahmadian et al.
arXiv:2402.14740; computed by ``slimgrpo.advantages``)::

    token ratio     r_it = exp(logp_it - old_it)                       GRPO, arXiv:2402.03300
    sequence ratio  s_i  = exp(sum_t m_it (logp_it - old_it) / |o_i|)   GSPO, arXiv:2507.18071
    surrogate       l_it = -min(c_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i)
                    c_it = r_it, or min(r_it, delta) with the two-sided cap of INTELLECT-2
                           (arXiv:2505.07291), which bounds the loss of negative-advantage tokens
                    eps_high > eps is DAPO's "clip-higher" (arXiv:2503.14476)
    KL penalty      l_it += beta * k3_it,  k3 = exp(ref - logp) - (ref - logp) - 1
                           (Schulman 2020, "Approximating KL divergence"; unbiased, >= 0)

The per-token losses are aggregated according to ``loss_type`` (``N`` = ``Normaliser``)::

    grpo      sum_i (sum_t l_it m_it / |o_i|) / N.num_sequences           arXiv:2402.03300
    bnpo      sum_it l_it m_it / N.num_tokens
    dapo      sum_it l_it m_it / N.num_tokens  (token-level, arXiv:2503.14476)
    dr_grpo   sum_it l_it m_it / (N.num_sequences * max_completion_length)  arXiv:2503.20783

The trainer fills ``Normaliser.num_tokens`` with the tokens of the whole batch for ``dapo`` (all ranks)
and with this rank's tokens times the world size for ``bnpo`` (TRL's "local batch"); in one process the
two coincide.  Because the divisors are totals over the whole batch
(every micro-batch, every rank), summing micro-batch losses gives the batch loss exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from slimgrpo.types import LossStats

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossSettings:
    """Which member of the GRPO family to optimise (names follow TRL's ``GRPOConfig``)."""

    loss_type: str = "dapo"  # how per-token losses are averaged, see the module docstring
    importance_sampling_level: str = "token"  # "token" (GRPO) or "sequence" (GSPO)
    epsilon: float = 0.2  # lower clip: ratios below 1 - epsilon stop pushing down
    epsilon_high: float | None = None  # upper clip 1 + epsilon_high; None: epsilon (DAPO: 0.28)
    delta: float | None = None  # cap on the unclipped ratio (INTELLECT-2); None means no cap
    beta: float = 0.0  # weight of the k3 KL penalty to the reference policy; 0 needs no reference
    max_completion_length: int | None = None  # fixed divisor of dr_grpo (required for it)

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(f"importance_sampling_level must be one of "
                             f"{IMPORTANCE_SAMPLING_LEVELS}, "
                             f"got {self.importance_sampling_level!r}")
        if not 0.0 < self.epsilon < 1.0:
            raise ValueError(f"epsilon must be in (0, 1), got {self.epsilon}")
        if self.epsilon_high is not None and not self.epsilon_high > 0.0:
            raise ValueError(f"epsilon_high must be > 0 or None, got {self.epsilon_high}")
        if self.delta is not None and not self.delta > 1.0:
            raise ValueError(f"delta caps the ratio from above and must be > 1 (INTELLECT-2 uses "
                             f"4; keep it above 1 + epsilon_high), got {self.delta}")
        if not self.beta >= 0.0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got "
                             f"{self.max_completion_length}")
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' divides by a constant max_completion_length; "
                             "set max_completion_length")

    @property
    def upper_epsilon(self) -> float:
        """``epsilon_high``, defaulting to ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


@dataclass
class Normaliser:
    """Batch totals the loss divides by; set by the trainer for the WHOLE optimiser step.

    ``num_sequences`` counts completions and ``num_tokens`` masked completion tokens over all
    micro-batches (and all data-parallel ranks when gradients are summed across them), so that
    the micro-batch losses add up to the batch loss.
    """

    num_sequences: int
    num_tokens: int

    def __post_init__(self) -> None:
        if self.num_sequences < 1 or self.num_tokens < 1:
            raise ValueError(f"Normaliser needs at least one sequence and one token, got "
                             f"num_sequences={self.num_sequences}, num_tokens={self.num_tokens}")

    @classmethod
    def of(cls, mask: Tensor) -> Normaliser:
        """Totals of a single batch ``mask`` [rows, T] (no accumulation, one rank)."""
        return cls(num_sequences=int(mask.shape[0]), num_tokens=int(mask.sum()))


# --- importance ratios --------------------------------------------------------------------------


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``log r_it = logp_it - old_it`` -> [rows, T]."""
    del mask
    return logp - old_logp


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token log-ratio: ``sg(log s_i) + logp_it - sg(logp_it)`` -> [rows, T].

    Its value is the sequence log-ratio ``log s_i = sum_t m_it (logp_it - old_it) / |o_i|`` on
    every token, and its gradient wrt ``logp_it`` is 1, so ``d s_it / d logp_it = s_i``
    (GSPO, arXiv:2507.18071, eq. for GSPO-token).
    """
    m = mask.to(logp.dtype)
    seq = ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [rows]
    return seq.detach()[:, None] + logp - logp.detach()


_LOG_RATIO: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


# --- per-token terms ----------------------------------------------------------------------------


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, epsilon: float, epsilon_high: float, delta: float | None
) -> Tensor:
    """``-min(c A, clip(r, 1 - eps, 1 + eps_high) A)``, ``c = min(r, delta)`` or ``r`` -> [rows, T].

    ``ratio`` [rows, T], ``advantages`` [rows].
    """
    adv = advantages[:, None]  # [rows, 1]
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    return -torch.minimum(unclipped * adv, clipped * adv)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k3 = exp(ref - logp) - (ref - logp) - 1``: unbiased, non-negative estimate of KL(pi||ref)."""
    diff = ref_logp - logp
    return torch.exp(diff) - diff - 1.0


# --- aggregation --------------------------------------------------------------------------------


def _sequence_mean(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    m = mask.to(loss.dtype)
    per_seq = (loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [rows]
    return per_seq.sum() / n.num_sequences


def _token_mean(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    return (loss * mask.to(loss.dtype)).sum() / n.num_tokens


def _constant_length(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    assert s.max_completion_length is not None  # LossSettings validates this for dr_grpo
    return (loss * mask.to(loss.dtype)).sum() / (n.num_sequences * s.max_completion_length)


_AGGREGATE: dict[str, Callable[[Tensor, Tensor, LossSettings, Normaliser], Tensor]] = {
    "grpo": _sequence_mean,
    "bnpo": _token_mean,
    "dapo": _token_mean,
    "dr_grpo": _constant_length,
}
assert set(_AGGREGATE) == set(LOSS_TYPES)


# --- the loss -----------------------------------------------------------------------------------


def _check_shapes(logp: Tensor, old_logp: Tensor | None, ref_logp: Tensor | None,
                  advantages: Tensor, mask: Tensor, beta: float) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [rows, T], got {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, "
                             f"got {tuple(t.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [rows] = [{logp.shape[0]}], got "
                         f"{tuple(advantages.shape)}")
    if beta > 0.0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (reference-policy log-probs)")


def _masked_means(values: list[Tensor], mask: Tensor) -> list[float]:
    """Masked means of several [rows, T] tensors with a single device-to-host copy."""
    m = mask.to(torch.float32)
    denom = m.sum().clamp(min=1.0)
    stacked = torch.stack([(v.detach().float() * m).sum() / denom for v in values])
    return stacked.tolist()


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    norm: Normaliser,
) -> tuple[Tensor, LossStats]:
    """The GRPO-family loss of one micro-batch (module docstring for the equations).

    Args:
        logp: ``[rows, T]`` float32 log-probs of the completion tokens under the policy (grad).
        old_logp: ``[rows, T]`` log-probs at sampling time; None when the policy has not moved
            since sampling (one update per batch): the ratio is then 1 with the right gradient.
        ref_logp: ``[rows, T]`` reference-policy log-probs; needed only when ``beta > 0``.
        advantages: ``[rows]`` one advantage per completion.
        mask: ``[rows, T]`` bool, True on completion tokens that count.
        settings: the objective.
        norm: whole-batch totals, so that micro-batch losses sum to the batch loss.

    Returns:
        ``(loss, stats)``: a scalar whose gradient flows to ``logp``, and detached ``LossStats``
        (``kl``, ``clip_ratio_*`` as masked token means of this micro-batch; ``entropy`` left 0
        for the trainer to fill).
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask, settings.beta)
    mask = mask.bool()
    old = logp.detach() if old_logp is None else old_logp
    ratio = torch.exp(_LOG_RATIO[settings.importance_sampling_level](logp, old, mask))  # [rows, T]
    eps_low, eps_high = settings.epsilon, settings.upper_epsilon
    per_token = clipped_surrogate(ratio, advantages, eps_low, eps_high, settings.delta)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    if settings.beta > 0.0:
        per_token = per_token + settings.beta * kl
    loss = _AGGREGATE[settings.loss_type](per_token, mask, settings, norm)

    adv = advantages[:, None]
    low = (ratio < 1.0 - eps_low) & (adv < 0)  # [rows, T]
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    kl_mean, low_mean, high_mean, region_mean = _masked_means([kl, low, high, low | high], mask)
    stats = LossStats(kl=kl_mean, clip_ratio_low=low_mean, clip_ratio_high=high_mean,
                      clip_ratio_region=region_mean)
    return loss, stats
