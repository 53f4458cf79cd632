"""Group-relative advantages: small pure functions over a [rows] reward vector (``advantage/compute.py``
chooses among them for a run; PPO's per-token ones are ``advantage/gae.py``).

Rows are group-major: row r belongs to prompt r // G (G = ``num_generations``).

A reward of NaN marks an unscorable row (every reward function returned ``None``). As in TRL 1.16,
such a row is left out of its group's mean and std (and of the batch std), and its advantage is 0.
A group with a single scorable row has no std (NaN): with std scaling its advantage is 0 too (TRL).
"""

from __future__ import annotations

from typing import Literal

import torch

from slimgrpo.collectives import SINGLE, Collectives

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


def global_nan_moments(x: torch.Tensor, ranks: Collectives = SINGLE) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of the non-NaN entries of ``x`` over every rank (one sum over ``ranks``)."""
    ok = ~torch.isnan(x)
    v = torch.where(ok, x, torch.zeros_like(x)).double()
    s = ranks.all_reduce_sum(torch.stack([v.sum(), (v * v).sum(), ok.sum().double()]))
    n = s[2]
    mean = s[0] / n.clamp(min=1)
    var = (s[1] - s[0] ** 2 / n.clamp(min=1)) / (n - 1).clamp(min=1)
    std = var.clamp(min=0).sqrt()  # 0 with fewer than two values (see ``nanstd``'s ``single``)
    return mean.float(), std.float()


def zero_std_fraction(rewards: torch.Tensor, num_generations: int) -> float:
    """Fraction of groups whose scorable rewards are all equal (they carry no learning signal)."""
    grouped = group_view(rewards.float(), num_generations)
    return float((nanstd(grouped, dim=1, single=0.0) < 1e-6).float().mean())
