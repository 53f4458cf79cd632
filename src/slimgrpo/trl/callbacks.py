"""A TRL script's ``TrainerCallback``s on slimgrpo's loop: transformers' own ``CallbackHandler`` called at the
moments a transformers ``Trainer`` calls it, with the trainer's ``TrainerState`` and ``TrainerControl``.

    on_train_begin -> per step: on_step_begin, on_step_end (global_step counted), on_log (every logging_steps
    steps, the metrics under TRL's names, each its mean over the steps since the last on_log, also appended to
    state.log_history), on_evaluate (when eval.data ran), on_save (when a checkpoint was written) -> on_log (the
    run's totals: train_loss, train_runtime ..., with the metrics of the steps since the last on_log, as TRL's
    last log_history entry has them) -> on_train_end

``control.should_training_stop`` set by a callback stops the run before its next step, as it stops TRL's.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from slimgrpo.train.events import RunEvents

__all__ = ["TrainerEvents"]

# metrics.jsonl's keys that are slimgrpo's own measurements, not the step's TRL metrics: left out of log_history.
_OWN_PREFIXES = ("time/", "memory/", "gen/", "stall/", "best/", "data/")


# What transformers' Trainer logs as the logging step's value, not as a mean over the steps since the last log.
_LAST_VALUE = ("grad_norm", "learning_rate", "epoch")


def trl_logs(metrics: dict[str, Any], epoch: float) -> dict[str, Any]:
    """A step's metrics as TRL's trainer logs them: its metric names (which metrics.jsonl shares), the epoch."""
    logs = {k: v for k, v in metrics.items() if k != "step" and not k.startswith(_OWN_PREFIXES)}
    if "time/step_s" in metrics:
        logs["step_time"] = metrics["time/step_s"]
    if "tools/calls_per_completion" in metrics:  # TRL's name for the same mean (tool calls / completions)
        logs["tools/call_frequency"] = metrics["tools/calls_per_completion"]
    logs["epoch"] = epoch
    return logs


def mean_logs(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The logs of the steps since the last ``on_log`` as TRL's ``log`` gives them: each metric's mean over those
    steps, NaN left out (None where no value is left), ``grad_norm``, ``learning_rate`` and ``epoch`` the last
    step's (transformers' Trainer logs those as they are at the logging step)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for step in steps for k in step):
        values = [step[key] for step in steps if key in step]
        if key in _LAST_VALUE or not all(isinstance(v, (int, float)) or v is None for v in values):
            out[key] = values[-1]
            continue
        valid = [float(v) for v in values if v is not None and not math.isnan(v)]
        out[key] = sum(valid) / len(valid) if valid else None
    return out


class TrainerEvents(RunEvents):
    """The run's moments (``train/events.py``) said to ``handler`` (a ``transformers.CallbackHandler``) with the
    script's ``args``, the trainer's ``state`` and ``control``. ``logging_steps``: how often ``on_log`` runs (0:
    never, TRL's ``logging_strategy="no"``)."""

    def __init__(self, handler, args, state, control, logging_steps: int):
        self.handler, self.args, self.state, self.control = handler, args, state, control
        self.logging_steps = logging_steps
        self.losses: list[float] = []
        self.pending: list[dict[str, Any]] = []  # the steps' logs since the last on_log
        self.started = 0.0

    def _epoch(self, loop: Any, step: int) -> float:
        return step * loop.cfg.prompts_per_step / max(len(loop.dataset), 1)

    def train_begin(self, loop: Any) -> None:
        self.started = time.perf_counter()
        self.state.max_steps = loop.cfg.run.max_steps
        self.control = self.handler.on_train_begin(self.args, self.state, self.control)

    def step_end(self, loop: Any, step: int, metrics: dict[str, Any]) -> bool:
        self.state.global_step = step
        self.state.epoch = self._epoch(loop, step)
        if math.isfinite(metrics.get("loss", math.nan)):
            self.losses.append(float(metrics["loss"]))
        self.control = self.handler.on_step_end(self.args, self.state, self.control)
        self.pending.append(trl_logs(metrics, self.state.epoch))
        if self.logging_steps and step % self.logging_steps == 0:
            self.log(mean_logs(self.pending))
            self.pending = []
        return bool(self.control.should_training_stop)

    def step_begin(self, loop: Any, step: int) -> None:
        self.control = self.handler.on_step_begin(self.args, self.state, self.control)

    def log(self, logs: dict[str, Any]) -> None:
        """``logs`` into ``state.log_history`` (with the step) and to every callback's ``on_log``."""
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.handler.on_log(self.args, self.state, self.control, logs=logs)

    def evaluated(self, loop: Any, step: int, metrics: dict[str, Any]) -> None:
        logs = {"eval_" + k.removeprefix("eval/").replace("/", "_"): v for k, v in metrics.items()}
        self.log({**logs, "epoch": self._epoch(loop, step)})
        self.control = self.handler.on_evaluate(self.args, self.state, self.control, metrics=logs)

    def saved(self, loop: Any, step: int, folder: Path | None) -> None:
        if folder is None:
            return
        self.control = self.handler.on_save(self.args, self.state, self.control)

    def train_end(self, loop: Any, summary: dict[str, Any]) -> None:
        runtime = time.perf_counter() - self.started
        steps = max(self.state.global_step, 1)
        best = loop.watch.best
        if best is not None and best.step is not None:
            self.state.best_global_step = best.step
        # As TRL's log(): the metrics of the steps since the last on_log go with the run's totals.
        unlogged = {k: v for k, v in mean_logs(self.pending).items() if k not in ("loss", "grad_norm",
                                                                                  "learning_rate")}
        self.pending = []
        self.log({**unlogged, "train_runtime": runtime,
                  "train_samples_per_second": steps * loop.cfg.run.batch_size / runtime,
                  "train_steps_per_second": steps / runtime, "total_flos": 0.0,
                  "train_loss": sum(self.losses) / len(self.losses) if self.losses else math.nan,
                  "epoch": self.state.epoch})
        self.control = self.handler.on_train_end(self.args, self.state, self.control)
