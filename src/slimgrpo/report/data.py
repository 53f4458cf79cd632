"""What ``slimgrpo report`` reads from a run folder (``load_run``): metrics as series (steps or wall time
on x), EMA smoothing, the run's status, first -> last changes. Only the standard library and PyYAML: no
torch."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("slimgrpo")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a half-written last line (a run killed mid-write) is skipped."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                log.warning("%s: skipping a truncated last line", path)
                continue
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        if isinstance(record, dict):
            records.append(record)
    return records


def number(value: Any) -> float:
    """A plottable float; null, strings and non-finite values become NaN (a gap in the line)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return math.nan


def ema(values: list[float], alpha: float) -> list[float]:
    """Bias-corrected exponential moving average (TensorBoard's smoothing): NaN stays NaN and is skipped;
    ``alpha`` = weight of the newest point (1 = no smoothing)."""
    out, acc, weight = [], 0.0, 0.0
    for v in values:
        if math.isnan(v):
            out.append(math.nan)
            continue
        acc = (1 - alpha) * acc + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(acc / weight)
    return out


def auto_alpha(points: int) -> float:
    """Smoothing for ``points`` values: none up to 30, then an EMA spanning about 1/12 of the run."""
    if points <= 30:
        return 1.0
    span = points / 12
    return 2.0 / (span + 1.0)


@dataclass
class Series:
    """One metric over the run: x = steps (or hours of training), y = values with NaN where null/absent."""

    key: str
    steps: list[float]
    values: list[float]

    @property
    def present(self) -> bool:
        return any(not math.isnan(v) for v in self.values)

    @property
    def finite(self) -> list[float]:
        return [v for v in self.values if not math.isnan(v)]

    def smoothed(self, alpha: float | None = None) -> "Series":
        a = auto_alpha(len(self.finite)) if alpha is None else alpha
        return Series(self.key, self.steps, ema(self.values, a))


class Metrics:
    """metrics.jsonl of one run. ``x="time"`` puts cumulative training time (``time/step_s``, minutes) on x."""

    def __init__(self, records: list[dict[str, Any]], x: str = "step"):
        self.records = records
        self.steps = [number(r.get("step", i + 1)) for i, r in enumerate(records)]
        self.x_kind = x
        self.xs = self.steps if x == "step" else _elapsed_minutes(records)
        self.keys = sorted({k for r in records for k in r})

    def series(self, key: str) -> Series:
        return Series(key, self.xs, [number(r.get(key)) for r in self.records])

    def has(self, *keys: str) -> bool:
        return any(self.series(k).present for k in keys)

    def reward_functions(self) -> list[str]:
        """Names of the reward functions, from the ``rewards/<fn>/mean`` keys, in first-seen order."""
        names: list[str] = []
        for r in self.records:
            for k in r:
                if k.startswith("rewards/") and k.endswith("/mean") and k[8:-5] not in names:
                    names.append(k[8:-5])
        return names

    @property
    def last_step(self) -> int:
        steps = [s for s in self.steps if not math.isnan(s)]
        return int(max(steps)) if steps else 0


def _elapsed_minutes(records: list[dict[str, Any]]) -> list[float]:
    """Minutes of training when each record was written: the running sum of ``time/step_s``."""
    total, out = 0.0, []
    for r in records:
        total += number(r.get("time/step_s")) if not math.isnan(number(r.get("time/step_s"))) else 0.0
        out.append(total / 60)
    return out


def read_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def config_value(config: dict[str, Any] | None, dotted: str, default: Any = None) -> Any:
    node: Any = config or {}
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def run_status(m: Metrics, summary: dict[str, Any], config: dict[str, Any] | None) -> tuple[str, str]:
    """(kind, sentence): kind is ``complete``, ``stopped`` or ``running``."""
    max_steps = config_value(config, "run.max_steps")
    of = f" of {max_steps}" if isinstance(max_steps, int) else ""
    step = int(summary.get("steps", m.last_step)) if summary else m.last_step
    best = kept_model_text(summary)
    if summary.get("stopped_by") == "early_stopping":
        return "stopped", (f"Stopped early at step {step}{of}: {summary.get('best_metric')} stopped improving "
                           f"(run.early_stopping_patience={summary.get('early_stopping_patience')}). {best}")
    if summary.get("stopped_by") == "stall":
        kept = summary.get("stall_checkpoint")
        return "stopped", (f"Stopped at step {step}{of}: learning stalled (run.stop_on_stall=true); "
                           + (f"the last checkpoint from before the stall is {kept}." if kept else
                              "no checkpoint from before the stall was saved."))
    if summary and (not isinstance(max_steps, int) or step >= max_steps) and not summary.get("preempted_by"):
        return "complete", f"Complete: {step}{of} steps." + (f" {best}" if best else "")
    if summary:
        why = f" by {summary['preempted_by']}" if summary.get("preempted_by") else ""
        return "stopped", (f"Stopped{why} at step {step}{of}; the checkpoint resumes it "
                           "(run the same command again).")
    return "running", (f"No summary.json: still running, or stopped without finishing; last record at step "
                       f"{step}{of}.")


# The metrics worth a first -> last line, in page order: (key, label, higher is better?).
DELTA_KEYS = [
    ("eval/accuracy_greedy", "held-out accuracy, greedy", True),
    ("eval/accuracy_sampled", "held-out accuracy, sampled", True),
    ("reward", "reward (total)", True),
    ("kl", "KL to reference", None),
    ("entropy", "entropy", None),
    ("completions/mean_length", "mean completion length", None),
    ("completions/clipped_ratio", "truncated completions", False),
    ("frac_reward_zero_std", "groups with zero reward std", False),
]


# Rows that are shares of something (shown as percentages, changes in points); reward means are numbers.
SHARE_LABELS = {label for key, label, _ in DELTA_KEYS
                if key in ("eval/accuracy_greedy", "eval/accuracy_sampled", "completions/clipped_ratio",
                           "frac_reward_zero_std")}


def is_share(label: str) -> bool:
    return label in SHARE_LABELS


def stalls(m: Metrics) -> list[tuple[int, int, str]]:
    """(first step, last step, reason) of each stalled stretch (monitor/stall.py): from ``stall/start_step`` to
    the last record that carries it; the reason from the record that detected it."""
    spans: dict[int, list] = {}
    for r in m.records:
        start, step = r.get("stall/start_step"), r.get("step")
        if isinstance(start, int) and isinstance(step, int):
            span = spans.setdefault(start, [start, step, ""])
            span[1] = max(span[1], step)
            if isinstance(r.get("stall/reason"), str):
                span[2] = r["stall/reason"]
    return [tuple(v) for _, v in sorted(spans.items())]


def kept_model_text(summary: dict[str, Any]) -> str:
    """Which step's model final/ holds (run.keep_best), or '' for a run that keeps its last step's."""
    final, metric, value = summary.get("final_step"), summary.get("best_metric"), summary.get("best_value")
    if final is None or not metric:
        return ""
    shown = f" = {value:.4g}" if isinstance(value, (int, float)) else ""
    if summary.get("best_checkpoint_problem"):
        return (f"final/ is the last step's model: the best checkpoint was damaged "
                f"({summary['best_checkpoint_problem']}).")
    where = "before training (step 0)" if final == 0 else f"step {final}"
    last = " (the last step's; run.keep_best)" if final == summary.get("steps") else \
        "; the last step's model is in last/"
    return f"final/ is the best model by {metric}{shown}: {where}{last}."


def best_step(m: Metrics) -> tuple[int, float] | None:
    """(step, value) of the best judgement (run.keep_best): the newest record's ``best/step``, ``best/value``."""
    for r in reversed(m.records):
        step, value = r.get("best/step"), r.get("best/value")
        if isinstance(step, int) and isinstance(value, (int, float)):
            return step, float(value)
    return None


def early_stop_span(m: Metrics) -> tuple[int, int] | None:
    """(best step, stop step) of a run stopped by early stopping: the stretch without improvement."""
    stop = next((r.get("step") for r in m.records if r.get("early_stopping/stopped")), None)
    best = best_step(m)
    return (best[0], stop) if isinstance(stop, int) and best is not None else None


def step_to_x(m: Metrics, step: float) -> float:
    """Where step ``step`` sits on the x axis (steps, or minutes of training)."""
    if m.x_kind == "step":
        return step
    pairs = [(s, x) for s, x in zip(m.steps, m.xs) if not math.isnan(s)]
    return min(pairs, key=lambda p: abs(p[0] - step))[1] if pairs else step


def deltas(m: Metrics) -> list[tuple[str, float, float]]:
    """(label, first, last) for the metrics present; reward functions follow the total reward.
    Training metrics are smoothed first (a single noisy step should not decide the change)."""
    rows: list[tuple[str, float, float]] = []
    keys = list(DELTA_KEYS)
    at = next(i for i, k in enumerate(keys) if k[0] == "reward") + 1
    keys[at:at] = [(f"rewards/{n}/mean", f"reward: {n}", True) for n in m.reward_functions()]
    for key, label, _ in keys:
        s = m.series(key)
        if not s.present:
            continue
        vals = s.finite if key.startswith("eval/") else s.smoothed().finite
        rows.append((label, vals[0], vals[-1]))
    return rows


# ----------------------------------------------------------------------------- a run folder


def load_run(run_dir: str | Path, x: str = "step") -> tuple[Metrics, dict[str, Any], dict[str, Any] | None]:
    """metrics, summary and config of a run folder; ValueError naming the file when it cannot be read."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise ValueError(f"run folder {str(run_dir)!r} does not exist")
    if not metrics_path.is_file():
        raise ValueError(
            f"{str(metrics_path)!r} does not exist: `slimgrpo report` needs a run folder written by "
            "`slimgrpo train` (its run.output_dir)"
        )
    m = Metrics(read_jsonl(metrics_path), x=x)
    if not m.records:
        raise ValueError(f"{str(metrics_path)!r} holds no records yet: nothing to report")
    summary: dict[str, Any] = {}
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        try:
            loaded = json.loads(summary_path.read_text())
            summary = loaded if isinstance(loaded, dict) else {}
        except json.JSONDecodeError:
            log.warning("%s is not valid JSON; summarising from metrics.jsonl instead", summary_path)
    return m, summary, read_config(run_dir)


def value_ranges(run_dir: Path) -> dict[str, tuple[float, float]]:
    """Lowest and highest value of ``reward`` and each ``reward/<fn>`` among the logged completions."""
    path = run_dir / "completions.jsonl"
    ranges: dict[str, tuple[float, float]] = {}
    if not path.is_file():
        return ranges
    for s in read_jsonl(path):
        for k, v in s.items():
            if (k == "reward" or k.startswith("reward/")) and isinstance(v, (int, float)) and math.isfinite(v):
                lo, hi = ranges.get(k, (v, v))
                ranges[k] = (min(lo, v), max(hi, v))
    return ranges
