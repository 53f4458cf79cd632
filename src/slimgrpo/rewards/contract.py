"""The extra keyword arguments TRL 1.16 passes to reward functions, beyond prompts/completions/columns.

TRL's ``GRPOTrainer._calculate_rewards`` adds to every call:

* ``trainer_state``: the trainer's ``transformers.TrainerState`` (``global_step``, ``max_steps``,
  ``epoch``, ``num_train_epochs``, ...), for rewards shaped by training progress;
* ``log_metric(name, value)``: a scalar logged with the step's metrics (the mean of the values logged
  during one step; across processes, the sum over every call divided by the number of calls);
* ``log_extra(column, values)``: an extra column of the completions table, one value per completion.

TRL passes them to every function, so its functions take ``**kwargs``. slimgrpo passes each one only
to functions that accept it (by name or through ``**kwargs``), so a function written with explicit
parameters and no ``**kwargs`` keeps working.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from slimgrpo.collectives import SINGLE, Collectives

CONTRACT_KWARGS = ("trainer_state", "log_metric", "log_extra")


def accepted_kwargs(fn: Callable, names: tuple[str, ...] = CONTRACT_KWARGS) -> tuple[str, ...]:
    """Which of ``names`` ``fn`` can take as keyword arguments (all of them when it has ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: be safe, pass nothing extra
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return names
    own = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return tuple(n for n in names if n in own)


class RewardLogs:
    """Collects ``log_metric`` / ``log_extra`` calls made by reward functions during one scoring call."""

    def __init__(self, rows: int):
        self.rows = rows
        self.metric_values: dict[str, list[float]] = {}
        self.extra: dict[str, list[Any]] = {}

    def log_metric(self, name: str, value: float) -> None:
        """Log a scalar for this step (the step's value is the mean over calls, as in TRL)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"log_metric: name must be a non-empty string, got {name!r}")
        value = float(value.item() if hasattr(value, "item") else value)
        self.metric_values.setdefault(name, []).append(value)

    def log_extra(self, column: str, values) -> None:
        """Add a column to the completions table: one value per completion of this batch."""
        if not isinstance(column, str) or not column:
            raise ValueError(f"log_extra: column must be a non-empty string, got {column!r}")
        values = list(values.tolist() if hasattr(values, "tolist") else values)
        self.extra.setdefault(column, []).extend(values)

    def records(self) -> tuple[dict[str, list[float]], dict[str, list[Any]]]:
        return self.metric_values, self.extra

    def merge(self, records: tuple[dict[str, list[float]], dict[str, list[Any]]]) -> None:
        """Add the calls recorded elsewhere (a forked reward process)."""
        metrics, extra = records
        for name, values in metrics.items():
            self.metric_values.setdefault(name, []).extend(values)
        for column, values in extra.items():
            self.extra.setdefault(column, []).extend(values)

    def metric_sums(self) -> dict[str, tuple[float, int]]:
        """``name -> (sum of values, number of calls)``: what processes add up before dividing."""
        return {n: (math.fsum(v), len(v)) for n, v in self.metric_values.items()}

    def extra_columns(self) -> dict[str, list[Any]]:
        """Columns padded (or cut) to one value per row; a column logged short is padded with None."""
        return {c: (v + [None] * self.rows)[: self.rows] for c, v in self.extra.items()}


def logs_in(kwargs: dict) -> RewardLogs | None:
    """The collector whose bound methods are in ``kwargs`` (used to send a forked call's logs back)."""
    for key in ("log_metric", "log_extra"):
        owner = getattr(kwargs.get(key), "__self__", None)
        if isinstance(owner, RewardLogs):
            return owner
    return None


def step_means(logged: dict[str, tuple[float, int]], ranks: Collectives = SINGLE) -> dict[str, float]:
    """The step's value of every ``log_metric`` name: sum over all calls of all processes / their number
    (the names are gathered, not summed: a rank's functions may log names another rank's did not)."""
    if ranks.enabled:
        totals: dict[str, list[float]] = {}
        for part in ranks.all_gather_object(logged):
            for name, (total, count) in part.items():
                acc = totals.setdefault(name, [0.0, 0])
                acc[0] += total
                acc[1] += count
        logged = {n: (t, c) for n, (t, c) in totals.items()}
    return {name: total / count for name, (total, count) in sorted(logged.items()) if count}


def make_trainer_state(max_steps: int, num_train_epochs: float | None = None, train_batch_size: int | None = None,
                       logging_steps: int = 1, save_steps: int = 0, world_process_zero: bool = True):
    """A ``transformers.TrainerState``, the object TRL hands its reward functions as ``trainer_state``."""
    from transformers import TrainerState

    state = TrainerState(
        max_steps=max_steps, logging_steps=logging_steps, save_steps=save_steps,
        train_batch_size=train_batch_size, is_world_process_zero=world_process_zero,
        is_local_process_zero=world_process_zero,
    )
    state.num_train_epochs = num_train_epochs if num_train_epochs is not None else 0
    state.global_step = 0
    state.epoch = 0.0
    return state
