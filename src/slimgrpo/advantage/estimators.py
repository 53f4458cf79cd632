"""Group-relative advantages: small pure functions over a [rows] reward vector.

Rows are group-major: row r belongs to prompt r // G (G = ``num_generations``).

A reward of NaN marks an unscorable row (every reward function returned ``None``). As in TRL 1.16,
such a row is left out of its group's mean and std (and of the batch std), and its advantage is 0.
A group with a single scorable row has no std (NaN): with std scaling its advantage is 0 too (TRL).
"""

from __future__ import annotations

from typing import Callable, Literal

import torch

EPS = 1e-4  # added to the std so groups with (almost) no spread do not explode, as in TRL
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def group_view(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """[rows] -> [groups, G]."""
    rows = rewards.numel()
    if rows % num_generations:
        raise ValueError(f"{rows} rewards cannot be split into groups of {num_generations}")
    return rewards.view(rows // num_generations, num_generations)


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, single: float = float("nan")
           ) -> torch.Tensor:
    """Unbiased (n - 1) std over the non-NaN entries; ``single`` (NaN, as TRL's) where fewer than two.

    With ``single=0`` a lone scorable reward gets advantage (r - r) / eps = 0, which is TRL's result
    (it turns the NaN into 0 afterwards) without hiding rewards that overflow (those stay non-finite,
    so the trainer skips the update and says why)."""
    d = dim if dim is not None else tuple(range(x.dim()))
    mean = torch.nanmean(x, dim=d, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=d, keepdim=True).to(x.dtype)
    var = torch.nansum((x - mean) ** 2, dim=d, keepdim=True) / (count - 1)
    var = torch.where(count > 1, var, torch.full_like(var, single))
    std = var.sqrt()
    return std if keepdim else std.squeeze(d) if dim is not None else std.reshape(())


def _zero_unscorable(advantages: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(rewards), torch.zeros_like(advantages), advantages)


def grpo_advantages(
    rewards: torch.Tensor,  # [rows], NaN = unscorable
    num_generations: int,
    scale_rewards: Literal["group", "batch", "none"] = "group",
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:  # [rows]
    """A_i = (r_i - mean_group(r)) / (std + eps) (DeepSeekMath, arXiv:2402.03300, eq. 3).

    ``scale_rewards``: ``group`` divides by the group's std, ``batch`` by the std of all rewards
    in the batch (``batch_std`` may pass the all-reduced value in distributed runs), ``none`` not at all
    (Dr. GRPO, arXiv:2503.20783, drops the std to remove a difficulty bias). The std is the unbiased
    (n - 1) estimate, matching ``torch.std``. Means and stds skip NaN rows.
    """
    grouped = group_view(rewards.float(), num_generations)
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (nanstd(grouped, dim=1, keepdim=True, single=0.0) + EPS)
    elif scale_rewards == "batch":
        std = batch_std if batch_std is not None else nanstd(rewards.float(), single=0.0)
        centred = centred / (std + EPS)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    return _zero_unscorable(centred.reshape(-1), rewards)


def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:  # [rows]
    """Leave-one-out baseline (RLOO, Ahmadian et al., arXiv:2402.14740):
    A_i = r_i - (sum_j r_j - r_i) / (G - 1)  =  G / (G - 1) * (r_i - mean(r)).

    With unscorable (NaN) rows the sum and G run over the scorable rows only (TRL's RLOOTrainer); a
    group with a single scorable row has no baseline and gets advantage 0."""
    if num_generations < 2:
        raise ValueError("RLOO needs at least 2 completions per prompt")
    grouped = group_view(rewards.float(), num_generations)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True).to(grouped.dtype)
    others = (torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (scorable - 1).clamp(min=1)
    adv = torch.where(scorable > 1, grouped - others, torch.zeros_like(grouped))  # no baseline: 0
    return _zero_unscorable(adv.reshape(-1), rewards)


def normalize_then_sum(per_function: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """GDPO (arXiv:2601.05242): each function normalised within its group, then the weighted sum -> [rows].

    ``per_function`` [rows, F] (NaN = that function returned None). Rows where every function is NaN
    stay NaN (unscorable)."""
    rows, F = per_function.shape
    grouped = per_function.float().view(rows // num_generations, num_generations, F)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True, single=0.0)  # TRL: NaN, then dropped by the nansum: the same
    normed = ((grouped - mean) / (std + EPS)).view(rows, F)
    total = torch.nansum(normed * weights.float()[None, :], dim=1)
    return torch.where(torch.isnan(per_function).all(dim=1), torch.full_like(total, float("nan")), total)


def batch_normalised(rewards: torch.Tensor, mean: torch.Tensor | None = None,
                     std: torch.Tensor | None = None) -> torch.Tensor:
    """(r - mean(r)) / (std(r) + eps) over the whole batch, NaN rows left out and given 0."""
    r = rewards.float()
    mean = torch.nanmean(r) if mean is None else mean
    std = nanstd(r, single=0.0) if std is None else std
    return _zero_unscorable((r - mean) / (std + EPS), r)


def compute_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    estimator: Literal["grpo", "rloo", "gae"] = "grpo",
    scale_rewards: Literal["group", "batch", "none"] = "group",
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dispatch on the configured estimator. RLOO is never scaled by a std. ``gae`` (PPO) returns the
    scores themselves: the critic stage (``update/critic.py``) turns them into per-token advantages."""
    if estimator == "gae":
        return rewards.float()
    if estimator == "rloo":
        return rloo_advantages(rewards, num_generations)
    return grpo_advantages(rewards, num_generations, scale_rewards, batch_std)


def global_nan_moments(x: torch.Tensor, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of the non-NaN entries of ``x`` over every rank (``all_reduce_sum``)."""
    ok = ~torch.isnan(x)
    v = torch.where(ok, x, torch.zeros_like(x)).double()
    s = all_reduce_sum(torch.stack([v.sum(), (v * v).sum(), ok.sum().double()]))
    n = s[2]
    mean = s[0] / n.clamp(min=1)
    var = (s[1] - s[0] ** 2 / n.clamp(min=1)) / (n - 1).clamp(min=1)
    std = var.clamp(min=0).sqrt()  # 0 with fewer than two values (see ``nanstd``'s ``single``)
    return mean.float(), std.float()


def zero_std_fraction(rewards: torch.Tensor, num_generations: int) -> float:
    """Fraction of groups whose scorable rewards are all equal (they carry no learning signal)."""
    grouped = group_view(rewards.float(), num_generations)
    return float((nanstd(grouped, dim=1, single=0.0) < 1e-6).float().mean())


# --- PPO: per-token rewards, GAE, whitening (loss.advantage_estimator = "gae") -------------------------


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
                  all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries (mean added back when not ``shift_mean``,
    TRL's ``whiten_rewards``); the variance is the unbiased one, as TRL's ``masked_var``; 0 off the mask.
    ``all_reduce_sum`` (torchrun): mean and variance over every rank's masked entries (two reductions)."""
    reduce = all_reduce_sum or (lambda t: t)
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
                       all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 a perfect critic, 0 one that predicts the
    mean, negative worse than that; NaN when the returns do not vary. ``all_reduce_sum`` (torchrun): over
    every rank's tokens (two reductions: the means, then the squared deviations)."""
    reduce = all_reduce_sum or (lambda t: t)
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    d = r - v
    sum_r, sum_d, n = reduce(torch.stack([r.sum(), d.sum(), torch.tensor(float(r.numel()), dtype=torch.float64,
                                                                           device=r.device)]))
    if int(n) < 2:
        return float("nan")
    ss_r, ss_d = reduce(torch.stack([((r - sum_r / n) ** 2).sum(), ((d - sum_d / n) ** 2).sum()]))
    return float(1.0 - ss_d / ss_r) if ss_r > 0 else float("nan")