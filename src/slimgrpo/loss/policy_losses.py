"""Per-token policy terms of the GRPO family, and the token masks that act on them.

Pure functions of per-token tensors (``[rows, T]``) and one advantage per row (``[rows]``); the
aggregation over tokens and rows lives in ``objectives.py``. Notation as there: ``r_it`` is the
importance ratio (token level ``exp(logp_it - old_it)``; sequence level the GSPO-token ratio, whose
value is ``s_i`` and whose gradient is ``s_i d logp_it``), ``A_i`` the advantage, ``m_it`` the mask.
Names and defaults follow TRL 1.16 (``GRPOConfig``); the equations are TRL's, checked against its
``GRPOTrainer._compute_loss``.

    clipped (grpo, bnpo, dapo, dr_grpo, luspo)
        l_it = -min(c_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i),  c_it = r_it or min(r_it, delta)
    cispo   (MiniMax-M1, arXiv:2506.13585; ScaleRL, arXiv:2510.13786)
        l_it = -sg(min(r_it, eps_max)) A_i logp_it          eps_max = epsilon_high (ScaleRL: 5.0)
        The ratio is capped and detached: every token keeps a gradient, none is clipped away.
    sapo    (Soft Adaptive Policy Optimization, arXiv:2511.20347)
        l_it = -(4 / tau_i) sigmoid(tau_i (r_it - 1)) A_i,  tau_i = tau_pos if A_i > 0 else tau_neg
        A smooth gate instead of the hard clip; its slope at r = 1 is 1, like the clipped surrogate.
    vespo   (Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693)
        l_it = -sg(phi(w_i)) A_i logp_it,   phi(w) = exp(lambda) w^k exp(-lambda w)   (phi(1) = 1)
        log w_i = clamp(sum_t m_it clamp(logp_it - old_it, -20, 20), log 1e-8, 20)  (a SUM, not a mean)
        (k, lambda) = (k_pos, lambda_pos) if A_i >= 0 else (k_neg, lambda_neg)
        phi is computed in log space and set to 0 where it is not finite.

Masks that multiply the policy term (never the KL term):

    off-policy sequence mask (DeepSeek-V3.2, arXiv:2512.02556, eq. 9)
        keep_i = [A_i >= 0] or [sum_t m_it (old_it - logp_it) / |o_i| <= delta_opsm]
    high-entropy tokens (Beyond the 80/20 Rule, arXiv:2506.01939)
        keep_it = m_it and H_it >= quantile_{1 - rho}({H_jt : m_jt}),  rho = top_entropy_quantile
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

VESPO_LOG_W_MIN = math.log(1e-8)  # clamp of log w (TRL's, from the VESPO reference code)
VESPO_LOG_W_MAX = 20.0


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, epsilon: float, epsilon_high: float, delta: float | None
) -> Tensor:
    """``-min(c A, clip(r, 1 - eps, 1 + eps_high) A)``, ``c = min(r, delta)`` or ``r`` -> [rows, T].

    ``ratio`` [rows, T], ``advantages`` [rows], or [rows, T] per token (PPO's GAE advantages).
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [rows, 1] or [rows, T]
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    return -torch.minimum(unclipped * adv, clipped * adv)


def cispo_term(logp: Tensor, ratio: Tensor, advantages: Tensor, epsilon_max: float) -> Tensor:
    """CISPO: ``-sg(min(r, eps_max)) A logp`` -> [rows, T] (MiniMax-M1, arXiv:2506.13585)."""
    weight = torch.clamp(ratio, max=epsilon_max).detach()
    return -weight * advantages[:, None] * logp


def sapo_term(ratio: Tensor, advantages: Tensor, temperature_pos: float,
              temperature_neg: float) -> Tensor:
    """SAPO: ``-(4 / tau) sigmoid(tau (r - 1)) A`` with ``tau`` by the sign of ``A`` -> [rows, T]
    (arXiv:2511.20347)."""
    adv = advantages[:, None]
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)
    return -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def vespo_weights(logp: Tensor, old_logp: Tensor, mask: Tensor, advantages: Tensor,
                  k_pos: float, lambda_pos: float, k_neg: float, lambda_neg: float) -> Tensor:
    """VESPO's gamma weight ``phi(w_i)`` per row -> [rows] (no gradient; module docstring)."""
    with torch.no_grad():
        m = mask.to(logp.dtype)
        log_ratio = torch.clamp(logp.detach() - old_logp, -20.0, 20.0)
        log_w = torch.clamp((log_ratio * m).sum(-1), VESPO_LOG_W_MIN, VESPO_LOG_W_MAX)  # [rows]
        nonneg = advantages >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def vespo_term(logp: Tensor, phi: Tensor, advantages: Tensor) -> Tensor:
    """VESPO: ``-phi(w_i) A_i logp_it`` -> [rows, T] (arXiv:2602.10693)."""
    return -(phi * advantages)[:, None] * logp


def off_policy_keep(logp: Tensor, old_logp: Tensor, mask: Tensor, advantages: Tensor,
                    threshold: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask -> [rows] bool: keep a row unless its advantage is
    negative AND its mean ``old - logp`` (a KL estimate from the sampling policy) exceeds ``threshold``."""
    m = mask.to(logp.dtype)
    kl = torch.nan_to_num(old_logp - logp.detach(), nan=0.0)
    mean_kl = (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return (advantages >= 0) | (mean_kl <= threshold)


def entropy_threshold(entropy: Tensor, mask: Tensor, top_quantile: float) -> Tensor | None:
    """The entropy at quantile ``1 - top_quantile`` of the masked tokens (a 0-dim tensor), or None
    when no token is masked in. ``torch.quantile`` interpolates linearly, as TRL's does."""
    values = entropy.detach()[mask.bool()].float()
    if values.numel() == 0:
        return None
    return torch.quantile(values, 1.0 - top_quantile)


def high_entropy_mask(entropy: Tensor, mask: Tensor, threshold: Tensor | float | None) -> Tensor:
    """Tokens of ``mask`` whose entropy is at least ``threshold`` -> [rows, T] bool (none if None)."""
    if threshold is None:
        return torch.zeros_like(mask, dtype=torch.bool)
    return (entropy.detach() >= threshold) & mask.bool()
