"""The objective section: loss type, clipping, KL, advantages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class LossConfig:
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """Aggregation: grpo = mean per sequence then over sequences; bnpo = mean over the batch's tokens;
    dr_grpo = sum / (sequences x max_completion_length); dapo = mean over all tokens of the global batch."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to the reference policy (0 = no reference model at all)."""
    epsilon: float = 0.2
    """Lower clipping bound: ratios below 1 - epsilon are clipped."""
    epsilon_high: float | None = None
    """Upper clipping bound (clip-higher, DAPO); None = epsilon."""
    delta: float | None = None
    """Two-sided clipping: cap the unclipped ratio at delta (INTELLECT-2); None = off."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the reward std of the group, of the whole batch, or not at all."""
    advantage_estimator: Literal["grpo", "rloo"] = "grpo"
    """``grpo``: reward minus group mean; ``rloo``: reward minus mean of the other completions."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``max_completion_length`` out of the loss."""
    num_iterations: int = 1
    """Optimizer steps per generated batch (mu in the GRPO paper); > 1 keeps old log-probs."""
    token_chunk: int | None = None
    """Tokens pushed through the LM head at once when computing log-probs (full logits never exist).
    None = auto: the largest power of two whose fp32 logits chunk stays under 64 MiB (64 tokens for a
    152K vocabulary)."""
    vocab_chunk: int | None = None
    """Also split the vocabulary into chunks of this size (online log-sum-exp); None = whole vocab."""
    fuse_head_loss: bool = True
    """Form the loss gradient inside the chunked LM-head pass (one fewer head product per chunk) when the
    objective allows it (token-level ratios, or no old log-probs; no ``vocab_chunk``); gradients are equal."""
