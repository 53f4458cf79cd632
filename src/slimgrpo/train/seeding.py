"""The seeds and switches that make a run repeatable: set once, before the model loads."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_all(seed: int) -> None:
    """Seed every global generator a step may draw from: torch (CPU and CUDA), Python's ``random`` and
    NumPy's legacy global state (reward functions often use the last two)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def enable_full_determinism() -> None:
    """TRL's (transformers') ``full_determinism``: deterministic kernels wherever torch has them. The cuBLAS
    workspace variable must be set before cuBLAS makes its first handle, so this runs before the model loads."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("FLASH_ATTENTION_DETERMINISTIC", "1")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
