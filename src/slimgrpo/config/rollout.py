"""The sampling section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class RolloutConfig:
    num_generations: int = 8
    """Completions sampled per prompt (the group size)."""
    max_completion_length: int = 256
    """Longest completion in tokens; longer ones are cut and flagged as truncated."""
    min_completion_length: int = 0
    """Suppress EOS before this many tokens (benchmarks pin the work with it)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy). The loss uses the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens below min_p times the top probability (0 = off)."""
    max_batch_rows: int | None = None
    """Generate at most this many completions at once (bounds KV-cache memory); None = all."""
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "int8"] = "auto"
    """KV cache storage while decoding: ``auto`` = the model dtype; ``fp8_e4m3`` / ``int8`` = one byte
    per value plus an fp32 scale per token and head (Llama-family lean decode only; see docs/memory.md)."""
