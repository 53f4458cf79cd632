"""Optimizer and schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class OptimConfig:
    learning_rate: float = 1e-6
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    """Schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup steps (from 0 to the peak)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""
