"""Group-relative advantages: small pure functions over a [rows] reward vector.

Rows are group-major: row r belongs to prompt r // G (G = ``num_generations``).
"""

from __future__ import annotations

from typing import Literal

import torch

EPS = 1e-4  # added to the std so groups with (almost) no spread do not explode, as in TRL


def group_view(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """[rows] -> [groups, G]."""
    rows = rewards.numel()
    if rows % num_generations:
        raise ValueError(f"{rows} rewards cannot be split into groups of {num_generations}")
    return rewards.view(rows // num_generations, num_generations)


def grpo_advantages(
    rewards: torch.Tensor,  # [rows]
    num_generations: int,
    scale_rewards: Literal["group", "batch", "none"] = "group",
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:  # [rows]
    """A_i = (r_i - mean_group(r)) / (std + eps) (DeepSeekMath, arXiv:2402.03300, eq. 3).

    ``scale_rewards``: ``group`` divides by the group's std, ``batch`` by the std of all rewards
    in the batch (``batch_std`` may pass the all-reduced value in distributed runs), ``none`` not at all
    (Dr. GRPO, arXiv:2503.20783, drops the std to remove a difficulty bias). The std is the unbiased
    (n - 1) estimate, matching ``torch.std``.
    """
    grouped = group_view(rewards.float(), num_generations)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + EPS)
    elif scale_rewards == "batch":
        std = batch_std if batch_std is not None else rewards.float().std()
        centred = centred / (std + EPS)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    return centred.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:  # [rows]
    """Leave-one-out baseline (RLOO, Ahmadian et al., arXiv:2402.14740):
    A_i = r_i - (sum_j r_j - r_i) / (G - 1)  =  G / (G - 1) * (r_i - mean(r))."""
    if num_generations < 2:
        raise ValueError("RLOO needs at least 2 completions per prompt")
    grouped = group_view(rewards.float(), num_generations)
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (num_generations - 1)
    return (grouped - others).reshape(-1)


def compute_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    estimator: Literal["grpo", "rloo"] = "grpo",
    scale_rewards: Literal["group", "batch", "none"] = "group",
    batch_std: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dispatch on the configured estimator. RLOO is never scaled by a std."""
    if estimator == "rloo":
        return rloo_advantages(rewards, num_generations)
    return grpo_advantages(rewards, num_generations, scale_rewards, batch_std)


def zero_std_fraction(rewards: torch.Tensor, num_generations: int) -> float:
    """Fraction of groups whose rewards are all equal (they carry no learning signal)."""
    grouped = group_view(rewards.float(), num_generations)
    return float((grouped.std(dim=1) < 1e-6).float().mean())
