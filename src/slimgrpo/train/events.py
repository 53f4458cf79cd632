"""What a run tells whoever listens while it trains (``RunEvents``): the loop calls each listener at the moments
TRL's trainer calls a ``TrainerCallback`` (``slimgrpo/trl/callbacks.py`` adapts those), and the Python API's step
functions are one kind of listener (``StepFunctions``).

    train_begin -> (every step: step_begin, step_end, then evaluated when an evaluation ran, saved when a
    checkpoint was written) -> train_end

Every method does nothing unless a listener overrides it; ``step_end`` returns True to stop the run before its
next step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

__all__ = ["RunEvents", "StepFunctions"]


class RunEvents:
    """A listener to a run's loop (module docstring). ``loop``: the ``TrainLoop`` calling."""

    def train_begin(self, loop: Any) -> None:
        """Before the first step of this call to ``train()`` (after a resume: its first new step)."""

    def step_begin(self, loop: Any, step: int) -> None:
        """Before step ``step`` (counted from 1) runs."""

    def step_end(self, loop: Any, step: int, metrics: dict[str, Any]) -> bool:
        """After step ``step`` (counted from 1) with its metrics (metrics.jsonl's keys); True stops the run."""
        return False

    def evaluated(self, loop: Any, step: int, metrics: dict[str, Any]) -> None:
        """An evaluation of ``eval.data`` ran after step ``step`` (0: before training); ``metrics``: its ``eval/*``."""

    def saved(self, loop: Any, step: int, folder: Path | None) -> None:
        """A checkpoint of step ``step`` was written to ``folder`` (None on the ranks that do not write it)."""

    def train_end(self, loop: Any, summary: dict[str, Any]) -> None:
        """The loop has ended (finished, stopped early or preempted); ``summary``: summary.json's contents."""


class StepFunctions(RunEvents):
    """The Python API's callbacks: ``fn(loop, step, metrics)`` after every step; one returning True stops."""

    def __init__(self, functions: list[Callable[[Any, int, dict[str, Any]], bool | None]]):
        self.functions = list(functions)

    def step_end(self, loop: Any, step: int, metrics: dict[str, Any]) -> bool:
        return any(bool(fn(loop, step, metrics)) for fn in self.functions)
