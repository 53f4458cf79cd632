"""The reward-functions section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RewardsConfig:
    functions: list[str] = field(default_factory=list)
    """Reward functions: built-in names (``gsm8k_accuracy``, ``boxed_accuracy``, ``format_strict``,
    ``format_lenient``, ``length``, ``code_execution``), ``package.module:function``, or
    ``path/to/file.py:function`` (relative to the config file)."""
    reward_weights: list[float] | None = None
    """One weight per function (default all 1.0). The total reward is their weighted sum."""
    on_error: Literal["raise", "zero", "skip"] = "raise"
    """A function that raises or returns bad values: stop, score the row 0, or ignore it (NaN)."""
    timeout_s: float | None = 120.0
    """Per-call time limit of a reward function in seconds (a ``timeout`` fault under ``on_error``; None =
    no limit). A call still running after 30 s logs a line every 30 s."""
    max_failed_steps: int = 10
    """Stop with an error when one function gives no usable value (every row a fault or None) for this many
    consecutive steps; each such step logs a warning naming the function (0 = never stop)."""
    isolation: Literal["thread", "process"] = "thread"
    """Run reward functions in a worker thread (a call past ``timeout_s`` is abandoned but keeps running)
    or in a child process that is killed on timeout (forked; spawned once CUDA is initialised, so the
    function must then be defined at the top level of a module or file)."""
