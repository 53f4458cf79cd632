"""The sampling section."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    repetition_penalty: float = 1.0
    """Hugging Face's repetition penalty on tokens already in the prompt or completion (> 1 discourages
    repeats; 1.0 = off). Sampling only: the loss scores tokens under the model at ``temperature``, as TRL."""
    max_batch_rows: int | None = None
    """Generate at most this many completions at once (bounds KV-cache memory); None = all."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call (TRL's ``tools``): ``package.module:function`` or ``file.py:function``
    (relative to the config file); type hints and a Google-style docstring give each its schema. Sync or
    async. The Python API also takes callables. See docs/agents.md."""
    environment: str | dict[str, str] | None = None
    """Environment factory (TRL's ``environment_factory``), ``module:Class`` or ``file.py:Class``: one
    instance per rollout, its public methods are tools, ``reset(**row)`` may add to the prompt,
    ``get_reward()`` is a reward named after the class. A mapping ``name: spec`` picks the factory by
    each row's ``environment`` column."""
    max_tool_calling_iterations: int | None = None
    """Most tool-calling rounds per completion (None = until the length limit), as in TRL."""
    rollout_function: str | None = None
    """Custom rollout (TRL's ``rollout_func``), ``module:function`` called as ``fn(prompts, trainer)``;
    it returns ``prompt_ids``, ``completion_ids``, ``logprobs`` (one list per completion), optionally
    ``env_mask``; other keys go to the reward functions."""
    tool_timeout_s: float | None = 10.0
    """Wall-clock limit per tool call; a call past it returns an error message to the model."""
    tool_sandbox: bool = False
    """Run each tool call in the code sandbox (a limited child process, rewards/sandbox.py) instead of
    this process; the tool's module source is sent there, so it must be self-contained."""
    max_concurrent_tool_calls: int = 8
    """Most rollout rows whose tool calls run at once (threads) after a turn; results go back in row order,
    each call under ``tool_timeout_s``. 1 = one row after another. Tools must be thread-safe when > 1."""
    max_tool_output_chars: int = 4000
    """Longer tool results are cut to this many characters (with a note) before the model sees them."""
    tool_call_format: Literal["auto", "hermes", "llama3"] = "auto"
    """How tool calls are written: ``hermes`` (``<tool_call>{json}</tool_call>``, Qwen2.5/Qwen3),
    ``llama3`` (a JSON-only turn), ``auto`` (Hermes blocks if present, else a JSON-only turn)."""
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "int8"] = "auto"
    """KV cache storage while decoding: ``auto`` = the model dtype; ``fp8_e4m3`` / ``int8`` = one byte
    per value plus an fp32 scale per token and head (Llama-family lean decode only; see docs/memory.md)."""
