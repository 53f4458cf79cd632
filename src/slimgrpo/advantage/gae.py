"""PPO's per-token advantages (``loss.advantage_estimator: gae``) as pure functions: the per-token
reward, GAE, whitening, the critic's metrics; and ``ppo_advantages``, the stage that chains them.

    scores [rows] (NaN = unscorable) + the critic's values [rows, T] + log-probs
      ─► token_rewards ─► (whiten) ─► gae ─► (whiten) ─► PPOAdvantages (advantages, returns, …)

The critic (``update/critic.py``) only produces the values; everything else is here. Under torchrun every
statistic that spans rows (whitening, explained variance, the value metrics) is a sum over ``ranks``, so N
ranks with 1/N of the rows each get what one process gets with all of them; GAE itself runs row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from slimgrpo.collectives import SINGLE, Collectives


@dataclass(frozen=True)
class PPOSettings:
    """The ``loss`` keys PPO's advantages read (``from_config``)."""

    gamma: float = 1.0  # loss.gamma: the discount between a completion's tokens
    lam: float = 0.95  # loss.lam: GAE's lambda
    kl_coef: float = 0.05  # loss.kl_coef: the KL penalty in every token's reward
    whiten_rewards: bool = False  # loss.whiten_rewards
    whiten_advantages: bool = True  # loss.whiten_advantages

    @classmethod
    def from_config(cls, loss_cfg) -> PPOSettings:
        L = loss_cfg
        return cls(L.gamma, L.lam, L.kl_coef, L.whiten_rewards, L.whiten_advantages)


@dataclass(frozen=True)
class PPOAdvantages:
    """What ``ppo_advantages`` gives the update: the tokens that count, per-token advantages and value
    targets, each row's mean advantage (for the completions log) and the critic's metrics."""

    mask: torch.Tensor  # [rows, T] bool: the loss mask without the unscorable rows
    advantages: torch.Tensor  # [rows, T] float32, 0 off ``mask``
    returns: torch.Tensor  # [rows, T] float32, the value targets, 0 off ``mask``
    row_mean: torch.Tensor  # [rows] the mean advantage over each row's tokens
    metrics: dict[str, float] = field(default_factory=dict)  # value/*, ppo/kl_penalty


def scorable_mask(mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``mask`` [rows, T] without the rows no reward function could score (``scores`` NaN): they leave the loss."""
    return mask & (~torch.isnan(scores)).to(mask.device)[:, None]


def ppo_advantages(scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, old_logp: torch.Tensor | None,
                   ref_logp: torch.Tensor | None, settings: PPOSettings, ranks: Collectives = SINGLE
                   ) -> PPOAdvantages:
    """A step's PPO advantages: per-token rewards (score at the last token, ``kl_coef`` penalty on every
    token), GAE over the critic's ``values`` (at sampling time), whitening as configured, and the metrics.

    ``scores`` [rows]; ``values``, ``mask`` (the loss mask), ``old_logp``, ``ref_logp`` [rows, T]. Rows with a
    NaN score leave the mask. ``ranks``: sums over every rank (whitening, metrics)."""
    S = settings
    mask = scorable_mask(mask, scores)
    rewards = token_rewards(scores.to(mask.device), mask, old_logp, ref_logp, S.kl_coef)
    if S.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False, ranks=ranks)
    advantages, returns = gae(rewards, values, mask, S.gamma, S.lam)
    if S.whiten_advantages:
        advantages = masked_whiten(advantages, mask, ranks=ranks)
    m = mask.float()
    row_mean = (advantages * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
    metrics = value_metrics(values, returns, mask, _kl_penalty(old_logp, ref_logp, m, S.kl_coef), ranks)
    return PPOAdvantages(mask, advantages, returns, row_mean, metrics)


def _kl_penalty(old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None, m: torch.Tensor,
                kl_coef: float) -> torch.Tensor | None:
    """The sum of the KL penalty over this rank's masked tokens; None when there is none."""
    if not kl_coef or ref_logp is None:
        return None
    return (kl_coef * (old_logp - ref_logp) * m).sum()


def value_metrics(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, kl_sum: torch.Tensor | None,
                  ranks: Collectives = SINGLE) -> dict[str, float]:
    """The critic's numbers of a step, over every rank's masked tokens: explained variance, the mean value
    and return, and (``kl_sum`` given) the mean KL penalty per token."""
    m = mask.float()
    kl = kl_sum.float() if kl_sum is not None else torch.zeros((), device=m.device)
    sums = ranks.all_reduce_sum(torch.stack([(values * m).sum(), (returns * m).sum(), kl, m.sum()]).double())
    n = sums[3].clamp(min=1.0)
    metrics = {
        "value/explained_variance": explained_variance(values, returns, mask, ranks),
        "value/mean": float(sums[0] / n),
        "value/returns_mean": float(sums[1] / n),
    }
    if kl_sum is not None:
        metrics["ppo/kl_penalty"] = float(sums[2] / n)
    return metrics


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, old_logp: torch.Tensor | None = None,
                  ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0) -> torch.Tensor:  # [rows, T]
    """The classic RLHF per-token reward (Ziegler et al. 2019; Ouyang et al. 2022; TRL's PPOTrainer):

        r_it = -kl_coef * (old_it - ref_it)  on every token with m_it
        r_it += score_i                      on the row's last token with m_it

    ``scores`` [rows] (unscorable rows NaN: they get no score, the trainer masks them out), ``mask``
    [rows, T] bool, ``old_logp`` / ``ref_logp`` [rows, T] the sampling policy's and the reference's
    log-probs (``k1`` estimate of the KL, as TRL's default ``kl_estimator``); needed when ``kl_coef > 0``.
    """
    m = mask.bool()
    rewards = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    if kl_coef:
        if old_logp is None or ref_logp is None:
            raise ValueError("kl_coef > 0 needs the sampling and reference log-probs")
        rewards = torch.where(m, -kl_coef * (old_logp.float() - ref_logp.float()), rewards)
    T = m.shape[1]
    last = T - 1 - torch.flip(m, dims=[1]).int().argmax(dim=1)  # index of the last True (T-1 when none)
    has = m.any(dim=1) & ~torch.isnan(scores)
    rows = torch.arange(m.shape[0], device=m.device)
    scores = scores.float().to(m.device)
    bonus = torch.where(has, torch.nan_to_num(scores), torch.zeros_like(scores))
    rewards[rows, last] += bonus
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438) -> (advantages, returns),
    both [rows, T], 0 where ``mask`` is False.

    Over the masked tokens of each row, in order (``t'`` = the next masked token after ``t``; none after
    the last one, where the episode ends and ``V = 0``)::

        delta_t = r_t + gamma * V_t' - V_t
        A_t     = delta_t + gamma * lam * A_t'
        R_t     = A_t + V_t                      (the value target)

    Unmasked positions (padding, tool results inside a multi-turn completion) are skipped: the
    environment's tokens are not actions, so they neither discount nor carry a value of their own.
    """
    m = mask.bool()
    r, v = rewards.float(), values.float()
    rows, T = m.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(rows, dtype=r.dtype, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(T - 1, -1, -1):  # T steps of [rows] vector work: cheap next to any forward pass
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        mt = m[:, t]
        adv[:, t] = torch.where(mt, a, torch.zeros_like(a))
        next_adv = torch.where(mt, a, next_adv)
        next_value = torch.where(mt, v[:, t], next_value)
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  ranks: Collectives = SINGLE) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries (mean added back when not ``shift_mean``,
    TRL's ``whiten_rewards``); the variance is the unbiased one, as TRL's ``masked_var``; 0 off the mask.
    ``ranks`` (torchrun): mean and variance over every rank's masked entries (two sums)."""
    reduce = ranks.all_reduce_sum
    m = mask.bool()
    total, n = reduce(torch.stack([torch.where(m, x, 0).sum(), m.sum().to(x.dtype)]))
    if int(n) < 2:  # no spread to divide by
        return torch.where(m, torch.zeros_like(x) if shift_mean else x, torch.zeros_like(x))
    mean = total / n
    var = reduce(torch.where(m, (x - mean) ** 2, 0).sum()) / (n - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       ranks: Collectives = SINGLE) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 a perfect critic, 0 one that predicts the
    mean, negative worse than that; NaN when the returns do not vary. ``ranks`` (torchrun): over every
    rank's tokens (two sums: the means, then the squared deviations)."""
    reduce = ranks.all_reduce_sum
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    d = r - v
    sum_r, sum_d, n = reduce(torch.stack([r.sum(), d.sum(), torch.tensor(float(r.numel()), dtype=torch.float64,
                                                                           device=r.device)]))
    if int(n) < 2:
        return float("nan")
    ss_r, ss_d = reduce(torch.stack([((r - sum_r / n) ** 2).sum(), ((d - sum_d / n) ** 2).sum()]))
    return float(1.0 - ss_d / ss_r) if ss_r > 0 else float("nan")