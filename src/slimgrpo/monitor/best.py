"""The best model so far (``run.keep_best``, TRL's ``load_best_model_at_end``) and early stopping
(``run.early_stopping_patience``, TRL's ``EarlyStoppingCallback``): one tracker over ``run.best_metric``.

A **judgement** is a step at which the metric is read:

- a held-out metric (``eval/...``): every step that ran an evaluation, the one before training (step 0)
  included, so a run that only got worse returns the model it started from;
- a training metric (``reward``, ``rewards/<fn>/mean``): every ``run.save_steps`` steps and the last step,
  on its mean over the steps since the last judgement (one step's reward is too noisy to pick a model by).

As in TRL, the best moves on any strict improvement. Unlike TRL, a held-out metric's exact tie is broken by the
evaluation's other scores (``TIE_BREAKERS``, in order): a small validation set saturates (a recipe's 32 prompts
judged 100% greedy at steps 20, 30 and 40 of a run whose sampled accuracy still rose from 91% to 100%), and
TRL's first-of-equals returned the least trained of them. Equal on those too, the first stays. The patience
counter is reset only by an improvement of more than ``run.early_stopping_threshold`` (a tie won is none), and
counts every other judgement. A new best is saved as a
checkpoint at that step (the trainer does it; pruning spares it: :meth:`BestTracker.protected_step`). A
judgement at a step whose checkpoint would not be kept (a non-finite streak or a collapse going on) or whose
value is not finite is never the best. The tracker's state travels in every checkpoint's ``extra``, so a
killed run resumes with its best-so-far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from slimgrpo.config.best import best_metric, is_eval_metric


# Held-out scores that break an exact tie of a held-out best_metric, in order (each: higher is better).
TIE_BREAKERS = ("eval/accuracy_sampled", "eval/mean_reward", "eval/accuracy_greedy")


def _number(raw: Any) -> float | None:
    return float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None


@dataclass(frozen=True)
class BestSettings:
    metric: str
    greater_is_better: bool = True
    patience: int | None = None  # judgements in a row without improvement before the run stops; None = never
    threshold: float = 0.0
    every: int = 0  # a training metric: judged every N steps (run.save_steps); a held-out one: 0
    max_steps: int = 0  # a training metric is judged at the last step too


def settings_for(cfg) -> BestSettings | None:
    """None when ``run.keep_best`` is off (validation saw to the rest)."""
    run = cfg.run
    if not run.keep_best:
        return None
    metric = best_metric(cfg)
    return BestSettings(metric, run.greater_is_better, run.early_stopping_patience, run.early_stopping_threshold,
                        every=0 if is_eval_metric(metric) else run.save_steps, max_steps=run.max_steps)


@dataclass(frozen=True)
class Judgement:
    """What one judgement says: the value read, whether it is a new best (save a checkpoint here), whether
    the patience ran out (stop), and the counter after it."""

    step: int
    value: float | None
    improved: bool
    stop: bool
    wait: int


@dataclass
class BestTracker:
    settings: BestSettings
    step: int | None = None  # the best judgement so far
    value: float | None = None
    wait: int = 0  # judgements since the last improvement of more than the threshold
    tie: tuple[float, ...] | None = None  # the best judgement's tie-breaking scores (TIE_BREAKERS)
    judged: list[tuple[int, float | None]] = field(default_factory=list)  # every judgement, for the summary
    _window: list[float] = field(default_factory=list)  # a training metric's values since the last judgement

    def _value(self, step: int, metrics: dict[str, Any]) -> tuple[bool, float | None]:
        """(is this step a judgement, the value read)."""
        s = self.settings
        number = _number(metrics.get(s.metric))
        if is_eval_metric(s.metric):
            return s.metric in metrics, number
        if step == 0:
            return False, None
        if number is not None and math.isfinite(number):
            self._window.append(number)
        if not (s.every and step % s.every == 0) and step != s.max_steps:
            return False, None
        values, self._window = self._window, []
        return True, (sum(values) / len(values) if values else None)

    def better(self, value: float, than: float | None, margin: float = 0.0) -> bool:
        if than is None:
            return True
        gain = value - than if self.settings.greater_is_better else than - value
        return gain > 0 and gain > margin

    def tie_scores(self, metrics: dict[str, Any]) -> tuple[float, ...] | None:
        """The tie-breaking scores of a held-out judgement (missing or non-finite: -inf); None for a training
        metric (its mean over several steps does not tie)."""
        if not is_eval_metric(self.settings.metric):
            return None
        values = (_number(metrics.get(k)) for k in TIE_BREAKERS if k != self.settings.metric)
        return tuple(v if v is not None and math.isfinite(v) else -math.inf for v in values)

    def wins_tie(self, value: float, scores: tuple[float, ...] | None) -> bool:
        """``value`` equals the best's and its tie-breaking scores are higher (compared in TIE_BREAKERS order)."""
        if scores is None or self.value is None or value != self.value:
            return False
        return self.tie is None or scores > self.tie

    def observe(self, step: int, metrics: dict[str, Any], eligible: bool = True) -> Judgement | None:
        """Feed every step's metrics (and the before-training evaluation as step 0), in order. ``eligible``:
        a checkpoint of this step would be kept (no non-finite streak or collapse going on)."""
        is_judgement, value = self._value(step, metrics)
        if not is_judgement:
            return None
        finite = value is not None and math.isfinite(value)
        previous = self.value
        scores = self.tie_scores(metrics)
        improved = eligible and finite and (self.better(value, previous) or self.wins_tie(value, scores))
        if eligible and finite and self.better(value, previous, self.settings.threshold):
            self.wait = 0
        elif step > 0:  # the evaluation before training starts the count, it is not a failure to improve
            self.wait += 1
        if improved:
            self.step, self.value, self.tie = step, value, scores
        self.judged.append((step, value if finite else None))
        patience = self.settings.patience
        stop = patience is not None and step > 0 and self.wait >= patience
        return Judgement(step, value if finite else None, improved, stop, self.wait)

    def fields(self, j: Judgement) -> dict[str, Any]:
        """The judgement's record in metrics.jsonl (``best/*``; ``early_stopping/*`` with a patience)."""
        out: dict[str, Any] = {"best/step": self.step, "best/value": self.value, "best/improved": int(j.improved)}
        if self.settings.patience is not None:
            out["early_stopping/wait"] = j.wait
            if j.stop:
                out["early_stopping/stopped"] = 1
        return out

    def protected_step(self) -> int | None:
        """The best judgement's checkpoint: pruning never deletes it."""
        return self.step

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.settings.metric, "step": self.step, "value": self.value, "wait": self.wait,
                "judged": [list(x) for x in self.judged], "window": list(self._window),
                "tie": [v if math.isfinite(v) else None for v in self.tie] if self.tie is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run: the best so far from the checkpoint. A checkpoint saved with another metric (or
        before keep_best was on) starts the tracker afresh."""
        if not state or state.get("metric") != self.settings.metric:
            return
        self.step, self.value, self.wait = state.get("step"), state.get("value"), int(state.get("wait", 0))
        self.judged = [(int(s), v) for s, v in state.get("judged", [])]
        self._window = [float(v) for v in state.get("window", [])]
        tie = state.get("tie")  # absent in a checkpoint from before tie-breaking: any tie then wins
        self.tie = tuple(-math.inf if v is None else float(v) for v in tie) if tie is not None else None


def tracker_for(cfg) -> BestTracker | None:
    settings = settings_for(cfg)
    return BestTracker(settings) if settings is not None else None


def stop_message(tracker: BestTracker, j: Judgement) -> str:
    """The line a run stopped by early stopping prints."""
    s = tracker.settings
    now = f"{j.value:.4g}" if j.value is not None else "no value"
    best = f"best {tracker.value:.4g} at step {tracker.step}" if tracker.value is not None else "no best yet"
    kept = f"the best model (step {tracker.step})" if tracker.step is not None else "the last step's model"
    margin = f" by more than {s.threshold:g}" if s.threshold else ""
    return (f"step {j.step}: early stopping: {s.metric} has not improved{margin} for {j.wait} judgement(s) in a "
            f"row (run.early_stopping_patience={s.patience}; now {now}, {best}). Stopping here; final/ will be "
            f"{kept}.")
