"""Typed containers passed between the stages of a GRPO step.

    data ──► rollout ──► rewards ──► advantages ──► loss ──► optimizer step ──► metrics

Shapes use these names:
    groups  number of prompts in the batch (each prompt is one group)
    G       ``num_generations`` completions per prompt
    rows    ``groups * G``; row ``r`` belongs to prompt ``r // G`` (group-major order)
    P       longest prompt in the batch (prompts are left-padded)
    T       longest completion in the batch (completions are right-padded)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

Message = dict[str, str]
Prompt = str | list[Message]  # plain text, or a conversation [{"role": ..., "content": ...}]


@dataclass
class PromptBatch:
    """Prompts of one step, as the dataset gave them, plus their token ids."""

    prompts: list[Prompt]  # [groups] raw prompts (what reward functions receive)
    prompt_ids: list[list[int]]  # [groups][len_i] token ids after the chat template
    columns: dict[str, list[Any]]  # extra dataset columns, each [groups] (e.g. "answer")
    indices: list[int] = field(default_factory=list)  # dataset row of each prompt


@dataclass
class Rollout:
    """Completions sampled for a batch of prompts."""

    prompt_ids: torch.Tensor  # [groups, P] long, left-padded with pad_token_id
    prompt_mask: torch.Tensor  # [groups, P] bool, True on real prompt tokens
    completion_ids: torch.Tensor  # [rows, T] long, right-padded with pad_token_id
    completion_mask: torch.Tensor  # [rows, T] bool, True up to and including EOS
    is_truncated: torch.Tensor  # [rows] bool, True when no EOS within max_completion_length
    sampler_logprobs: torch.Tensor  # [rows, T] float32, log-prob under the sampling distribution
    num_generations: int  # G
    # Multi-turn (tool-calling) rollouts; see slimgrpo.agent.rollout.
    tool_mask: torch.Tensor | None = None  # [rows, T] bool, True on tokens the model wrote (None: all)
    prompts_per_row: bool = False  # prompt_ids/prompt_mask hold one row per completion ([rows, P])
    conversations: list[Any] | None = None  # [rows] whole conversations (messages after the prompt)
    reward_columns: dict[str, list[Any]] = field(default_factory=dict)  # extra per-row reward kwargs
    metrics: dict[str, float] = field(default_factory=dict)  # rollout metrics (tools/...)

    @property
    def rows(self) -> int:
        return int(self.completion_ids.shape[0])

    @property
    def completion_lengths(self) -> torch.Tensor:  # [rows] long
        return self.completion_mask.sum(-1)

    @property
    def model_mask(self) -> torch.Tensor:  # [rows, T] bool: completion tokens the model wrote
        return self.completion_mask if self.tool_mask is None else self.completion_mask & self.tool_mask

    @property
    def model_lengths(self) -> torch.Tensor:  # [rows] long: tokens the model wrote (tool results left out)
        return self.model_mask.sum(-1)

    def row_prompt_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt ids and mask repeated per row: ([rows, P], [rows, P])."""
        if self.prompts_per_row:
            return self.prompt_ids, self.prompt_mask
        G = self.num_generations
        return (
            self.prompt_ids.repeat_interleave(G, dim=0),
            self.prompt_mask.repeat_interleave(G, dim=0),
        )


@dataclass
class RewardOutput:
    """Scores of every reward function for every completion."""

    per_function: torch.Tensor  # [rows, F] float32; NaN where a function returned None (or skipped)
    total: torch.Tensor  # [rows] float32; weighted nansum over functions, NaN where every function is NaN
    #                      (unscorable: no reward; a value shown or logged per row turns it into a number there)
    names: list[str]  # [F]
    fault_counts: dict[str, int] = field(default_factory=dict)  # "<name>/<fault>" -> count
    # From the functions' log_metric calls: name -> (sum of values, number of calls) on this process.
    logged_metrics: dict[str, tuple[float, int]] = field(default_factory=dict)
    extra_columns: dict[str, list] = field(default_factory=dict)  # log_extra: column -> [rows] values


@dataclass
class LossStats:
    """Detached statistics of one loss evaluation (means over completion tokens)."""

    kl: float = 0.0
    clip_ratio_low: float = 0.0  # fraction of tokens clipped at 1 - epsilon (negative advantage)
    clip_ratio_high: float = 0.0  # fraction of tokens clipped at 1 + epsilon_high (positive advantage)
    clip_ratio_region: float = 0.0  # fraction of tokens whose ratio lies outside the trust region
    entropy: float = 0.0
    clip_count: int = 0  # what the clip fractions are means over: tokens, or sequences (GSPO, VESPO)
    extra: dict[str, float] = field(default_factory=dict)  # loss-type statistics, means over clip_count
    # Entropy bonus on: sum of the entropy over the tokens it acts on, and their count (adaptive control).
    bonus_entropy_sum: float = 0.0
    bonus_tokens: float = 0.0
    # The loss without the entropy bonus (the policy term, with the KL term): TRL's ``policy_loss``.
    policy_loss: float = 0.0
