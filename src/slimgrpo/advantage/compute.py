"""A step's advantages from its rewards: the one route from ``RewardOutput`` to the [rows] advantages the
update takes, for every estimator and aggregation a run can choose.

    rewards (per function, total; NaN = no value) ─► AdvantageSettings ─► compute_advantages ─► [rows]

What the estimators are is ``advantage/estimators.py``'s; this module only chooses among them and takes the
whole job's statistics where a setting needs them (``ranks``: sums over every rank, so N ranks with 1/N of
the groups each get the advantages one process gets with all of them). PPO's per-token advantages (GAE)
come later, from the critic's values (``advantage/gae.py``): here ``gae`` passes the scores through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from slimgrpo.advantage.estimators import (batch_normalised, global_nan_moments, grpo_advantages,
                                           normalize_then_sum, rloo_advantages)
from slimgrpo.collectives import SINGLE, Collectives
from slimgrpo.containers import RewardOutput


@dataclass(frozen=True)
class AdvantageSettings:
    """What the advantages of a run depend on, read once from the config (``from_config``)."""

    num_generations: int  # G: rows r and r' are one group when r // G == r' // G
    estimator: Literal["grpo", "rloo", "gae"] = "grpo"  # loss.advantage_estimator
    scale_rewards: Literal["group", "batch", "none"] = "group"  # loss.scale_rewards (GRPO only)
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    weights: tuple[float, ...] = ()  # one per reward function (normalize_then_sum weighs the normalised scores)

    @classmethod
    def from_config(cls, cfg, weights: Sequence[float]) -> AdvantageSettings:
        """``cfg``: the run's ``Config`` (its ``loss`` and ``rollout`` sections); ``weights``: the reward
        runner's, one per function it calls (the environments' ``get_reward`` included)."""
        L = cfg.loss
        return cls(cfg.rollout.num_generations, L.advantage_estimator, L.scale_rewards,
                   L.multi_objective_aggregation, tuple(float(w) for w in weights))


def compute_advantages(rewards: RewardOutput, settings: AdvantageSettings, ranks: Collectives = SINGLE,
                       device: torch.device | str | None = None) -> torch.Tensor:  # [rows] on ``device``
    """The advantage of every row of this rank (rows with no reward, NaN in ``rewards.total``: 0).

    - ``normalize_then_sum`` (GDPO): each function normalised in its group, weighted and summed, then
      normalised over the whole job's batch (mean and std summed over ``ranks``); ``scale_rewards`` unused.
    - ``rloo``: the leave-one-out baseline of each group, never scaled.
    - ``grpo``: the group baseline, scaled by the group's std, the batch's (over ``ranks`` when there are
      several) or not at all.
    - ``gae``: the scores as they are (NaN kept: the PPO stage masks those rows out).

    ``device``: where the result goes and where collectives run (NCCL moves device tensors only); the group
    arithmetic itself stays where the rewards are (the CPU), so the numbers do not depend on the device.
    """
    G = settings.num_generations
    device = torch.device(device) if device is not None else rewards.total.device
    if settings.aggregation == "normalize_then_sum":
        weights = torch.tensor(settings.weights, dtype=torch.float32)
        total = normalize_then_sum(rewards.per_function, weights, G).to(device)
        mean, std = global_nan_moments(total, ranks)
        return batch_normalised(total, mean, std)
    total = rewards.total
    if settings.estimator == "gae":
        return total.float().to(device)
    if settings.estimator == "rloo":
        return rloo_advantages(total, G).to(device)
    batch_std = None
    if settings.scale_rewards == "batch" and ranks.enabled:  # one process: the batch std of its own rows
        batch_std = global_nan_moments(total.to(device), ranks)[1].to(total.device)
    return grpo_advantages(total, G, settings.scale_rewards, batch_std).to(device)
