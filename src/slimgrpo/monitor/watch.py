"""Is the run still healthy? One component that watches each step and says when the run must stop.

    watch = RunWatch(cfg, dist, output_dir, model)
    watch.after_update(skipped, step_idx)      # non-finite streak: NonFiniteError after run.max_nonfinite_steps
    stop = watch.observe(step_idx, metrics)    # the stall detector (monitor/stall.py): stall/* into metrics
    watch.check(step_idx, metrics)             # the collapse monitor (monitor/health.py): PolicyCollapsedError
    watch.check_at_end(step_idx, stopped)      # a run that ends diverged or collapsed is not a success
    judged = watch.judge(step_idx, metrics)    # run.keep_best / early stopping (monitor/best.py): best/* into metrics

It owns the non-finite streak (saved with each checkpoint: :meth:`state_dict`, :meth:`resume`), the collapse
monitor, the stall detector and the stall that stopped the run, and the best model so far with the early
stopping count (``monitor/best.py``, saved with each checkpoint too). ``Trainer`` calls it; the checkpoints
(``checkpoint/manager.py``) save its state and replay the run's history into it on resume.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slimgrpo.checkpoint import format as ckpt
from slimgrpo.monitor import best
from slimgrpo.monitor import health
from slimgrpo.monitor import stall
from slimgrpo.distributed.context import DistContext

log = logging.getLogger("slimgrpo")


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with a NaN/inf loss or gradient."""


class PolicyCollapsedError(NonFiniteError):
    """Finite weights that no longer learn: see :mod:`slimgrpo.monitor.health` (exit 3 like a divergence)."""


class RunWatch:
    """The health of a run (module docstring). ``cfg``: its ``run`` section (``max_nonfinite_steps``, the
    collapse and stall limits, ``stop_on_stall``) and ``optim.learning_rate`` (named in the diagnosis);
    ``model``: the policy's model, for the vocabulary size the collapse check compares the entropy with."""

    def __init__(self, cfg, dist: DistContext, output_dir: Path, model):
        self.cfg, self.dist, self.output_dir = cfg, dist, output_dir
        self.nonfinite_streak = 0
        self.health = health.monitor_for(cfg, model)  # a collapsed policy stops the run (exit 3)
        self.stall = stall.detector_for(cfg)  # says when learning stalls; run.stop_on_stall stops there (exit 5)
        self.stalled: stall.Stall | None = None  # the stall that stopped the run (run.stop_on_stall)
        self.best = best.tracker_for(cfg)  # run.keep_best: the best judgement of run.best_metric; None when off
        self.early_stopped: best.Judgement | None = None  # the judgement that stopped the run

    def after_update(self, skipped: bool, step_idx: int) -> None:
        """Count updates skipped as non-finite in a row; stop after ``run.max_nonfinite_steps``."""
        if not skipped:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)",
                    step_idx + 1, self.nonfinite_streak)
        if self.nonfinite_streak >= self.cfg.run.max_nonfinite_steps:
            raise NonFiniteError(ckpt.nonfinite_diagnosis(self.nonfinite_streak, step_idx + 1, self.output_dir))

    def observe(self, step_idx: int, metrics: dict[str, Any]) -> bool:
        """Say once when learning stalled (monitor/stall.py); True: stop there (run.stop_on_stall, exit 5)."""
        verdict = self.stall.observe(step_idx, metrics)
        metrics.update(verdict.fields)  # stall/* into this step's record
        for warning in verdict.warnings if self.dist.is_main else []:
            log.warning(warning)
        if verdict.detected is not None:
            if self.dist.is_main:
                log.warning(stall.stall_notice(verdict.detected, self.output_dir, self.cfg.run.stop_on_stall,
                                               keep_best=self.best is not None and self.best.step is not None))
            if self.cfg.run.stop_on_stall:  # the same numbers on every rank: every rank stops here
                self.stalled = verdict.detected
                return True
        return False

    def judge(self, step_idx: int, metrics: dict[str, Any]) -> best.Judgement | None:
        """``run.keep_best``: read ``run.best_metric`` at a judgement (monitor/best.py); ``best/*`` into the record.
        The answer's ``improved``: save a checkpoint at this step (the new best); ``stop``: the patience ran
        out (``run.early_stopping_patience``). Step 0: the evaluation before training. None: not a judgement."""
        if self.best is None:
            return None
        j = self.best.observe(step_idx, metrics, eligible=self.healthy)
        if j is None:
            return None
        metrics.update(self.best.fields(j))
        if j.stop:
            self.early_stopped = j
            if self.dist.is_main:
                log.warning(best.stop_message(self.best, j))
        return j

    def protected_steps(self) -> tuple[int, ...]:
        """Checkpoints pruning must spare: the newest at or before each of these steps (the last one from
        before a stalled stretch; the best model's)."""
        steps = (self.stall.protected_step(), self.best.protected_step() if self.best else None)
        return tuple(s for s in steps if s is not None)

    def check(self, step_idx: int, metrics: dict[str, Any]) -> None:
        """Warn at a step whose policy looks collapsed; stop after ``run.max_collapsed_steps`` in a row."""
        reason = self.health.observe(step_idx, metrics)
        if reason is not None:
            log.warning("step %d: the policy looks collapsed: %s (%d in a row, run.max_collapsed_steps=%d)",
                        step_idx, reason, self.health.streak, self.cfg.run.max_collapsed_steps)
        if self.health.should_stop:
            raise PolicyCollapsedError(health.collapse_diagnosis(self.health, step_idx, self.output_dir,
                                                                 self.cfg.optim.learning_rate))

    @property
    def healthy(self) -> bool:
        """No update skipped and no collapse going on: a checkpoint now is worth keeping."""
        return not self.nonfinite_streak and not self.health.in_streak

    def check_at_end(self, step_idx: int, stopped: bool) -> None:
        """The run ends while its last updates were skipped as non-finite (the model as it stands gives
        NaN/inf) or its policy collapsed (finite weights that no longer learn): stop without a final model.
        ``stopped``: a signal, a callback or a stall stopped the run (no verdict then)."""
        if stopped:
            return
        if self.nonfinite_streak:
            raise NonFiniteError(ckpt.nonfinite_diagnosis(self.nonfinite_streak, step_idx, self.output_dir,
                                                          at_end=True))
        if self.health.in_streak:
            raise PolicyCollapsedError(health.collapse_diagnosis(self.health, step_idx, self.output_dir,
                                                                 self.cfg.optim.learning_rate, at_end=True))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves of the watch (its ``extra``)."""
        out: dict[str, Any] = {"nonfinite_streak": self.nonfinite_streak}
        if self.best is not None:
            out["best"] = self.best.state_dict()
        return out

    def resume(self, extra: dict[str, Any], history: list[dict[str, Any]] | None) -> None:
        """A resumed run: the streak from the checkpoint's ``extra``; ``history`` (metrics.jsonl up to the
        checkpoint; None where this rank may not see it) replayed into the collapse monitor ("reward fell"
        compares with the whole run) and the stall detector (a stretch going on when it was saved)."""
        self.nonfinite_streak = int(extra.get("nonfinite_streak", 0))
        if self.best is not None:  # the best so far and the patience count, as saved
            self.best.load_state_dict(extra.get("best") or {})
        if history is not None:
            self.health.remember_rewards(history)
            self.stall.replay(history)

    def summary_fields(self) -> dict[str, Any]:
        """The stall fields of summary.json, and the best judgement's (``best_metric``, ``best_step``,
        ``best_value``; ``stopped_by: early_stopping``)."""
        out = stall.summary_fields(self.stall, self.stalled, self.output_dir)
        if self.best is not None:
            out.update({"best_metric": self.best.settings.metric, "best_step": self.best.step,
                        "best_value": self.best.value})
        if self.early_stopped is not None:
            out.update({"stopped_by": "early_stopping", "early_stopping_patience": self.best.settings.patience})
        return out
