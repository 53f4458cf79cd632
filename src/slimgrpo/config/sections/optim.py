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
    warmup_steps: int | float = 0
    """Linear warmup steps (from 0 to the peak). A number below 1 is a fraction of ``run.max_steps``
    (rounded up), as in transformers: ``0.1`` = the first 10% of the steps."""
    warmup_ratio: float = 0.0
    """Warmup as a fraction of ``run.max_steps`` (the transformers < 5 / older TRL name; same as a
    ``warmup_steps`` below 1). Set one of the two."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""
