"""Per-step metrics: metrics.jsonl (always), sample completions, the console line, peak memory."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from slimgrpo.output.backends import Backend
from slimgrpo.redact import scrub

EVAL_PREFIX = "eval/"  # held-out evaluation metrics (evaluate/during.py writes them)


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_memory_mib(device: torch.device) -> float:
    """CUDA peak allocated on GPU, peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


def memory_metrics(device: torch.device) -> dict[str, float]:
    """The step's memory figures, each a peak so far (MiB). ``memory/peak_mib``: CUDA peak allocated (what
    the plan predicts) or, on CPU, peak RSS. On CUDA also what the allocator behind it holds:
    ``memory/peak_reserved_mib`` (the caching allocator's peak, what an out-of-memory error and nvidia-smi
    see), ``memory/pinned_host_peak_mib`` (pinned host memory: the caching host allocator's peak plus what was
    pinned in place, the offloaded activations' pool and a streamed reference's weights: memory/pinned.py)
    and ``memory/host_peak_rss_mib`` (this process's peak RSS)."""
    out = {"memory/peak_mib": peak_memory_mib(device)}
    if device.type == "cuda":
        out["memory/peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
        stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
        from slimgrpo.memory.pinned import registered_bytes  # pinned in place: not in host_memory_stats

        pinned = float(stats.get("allocated_bytes.peak", 0)) + registered_bytes()[1]
        out["memory/pinned_host_peak_mib"] = pinned / 2**20
        out["memory/host_peak_rss_mib"] = peak_rss_mib()
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not defined this step"
    return value


def masked_stats(values: torch.Tensor) -> tuple[float, float]:
    """nan-aware mean and std of a 1-D tensor (NaN = a reward function returned None)."""
    finite = values[~torch.isnan(values)]
    if finite.numel() == 0:
        return float("nan"), float("nan")
    std = finite.std().item() if finite.numel() > 1 else 0.0
    return finite.mean().item(), std


# Short labels for the compact console line, in display order.
CONSOLE_KEYS = [
    ("reward", "reward", "{:.3f}"),
    ("kl", "kl", "{:.4f}"),
    ("entropy", "ent", "{:.2f}"),
    ("completions/mean_length", "len", "{:.0f} tok"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("value/loss", "vloss", "{:.4f}"),  # PPO's critic: value loss and explained variance
    ("value/explained_variance", "ev", "{:.2f}"),
    ("gen/tokens_per_s", "gen", "{:.0f} tok/s"),
    ("time/step_s", "step", "{:.2f} s"),
    ("memory/peak_mib", "peak", "{:.0f} MiB"),
]


def console_line(step: int, metrics: dict[str, Any]) -> str:
    parts = [f"step {step}:"]
    for key, label, fmt in CONSOLE_KEYS:
        v = metrics.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            parts.append(f"{label} {fmt.format(v)}")
    for key, v in metrics.items():
        if key.startswith("rewards/") and key.endswith("/mean") and isinstance(v, (int, float)):
            parts.append(f"{key[8:-5]} {v:.3f}")
    if any(k.startswith(EVAL_PREFIX) for k in metrics):
        parts.append(f"| eval {describe_eval(metrics)}{_eval_note(metrics)}")
    return "  ".join(parts)


def _eval_note(metrics: dict[str, Any]) -> str:
    """What the evaluation cost (``time/eval_s``) and whether it is a new best (``run.keep_best``)."""
    cost = metrics.get("time/eval_s")
    notes = [f"{cost:.1f} s"] if isinstance(cost, (int, float)) and math.isfinite(cost) else []
    if metrics.get("best/improved"):
        notes.append("new best")
    return f"  ({', '.join(notes)})" if notes else ""


def describe_eval(metrics: dict[str, Any]) -> str:
    """``greedy 53.5%  sampled 29.5%  pass@8 71.0%`` from eval/ metrics ('' when there are none)."""
    parts = []
    for key, label in (("accuracy_greedy", "greedy"), ("accuracy_sampled", "sampled")):
        v = metrics.get(EVAL_PREFIX + key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            parts.append(f"{label} {v:.1%}")
    for key, v in metrics.items():
        if key.startswith(EVAL_PREFIX + "pass@") and isinstance(v, (int, float)) and math.isfinite(v):
            parts.append(f"{key[len(EVAL_PREFIX):]} {v:.1%}")
    return "  ".join(parts)


def _record_step(line: str) -> int | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record.get("step", 0) if isinstance(record, dict) else None


class MetricsWriter:
    """Appends one JSON object per step to ``metrics.jsonl`` and sample completions to
    ``completions.jsonl``; forwards metrics to optional backends."""

    def __init__(self, output_dir: str | Path, enabled: bool = True, backends: list[Backend] | None = None):
        self.dir = Path(output_dir)
        self.enabled = enabled
        self.backends = backends or []
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        return self.dir / "metrics.jsonl"

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for backend in self.backends:
            backend.log(step, record)

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not self.enabled or not samples:
            return
        with (self.dir / "completions.jsonl").open("a") as f:
            for s in samples:
                f.write(json.dumps(scrub({"step": step, **{k: _clean(v) for k, v in s.items()}})) + "\n")
        for backend in self.backends:
            backend.log_completions(step, samples)

    def truncate_after(self, step: int, saved_history: Path | None = None) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone).

        ``saved_history`` is the checkpoint's copy of metrics.jsonl: when present it is the history up to
        ``step``, whatever happened to the live file since. Lines that do not parse (a kill in the middle of
        writing one) are dropped. The files are rewritten atomically."""
        if not self.enabled:
            return
        for name in ("metrics.jsonl", "completions.jsonl"):
            p = self.dir / name
            source = saved_history if name == "metrics.jsonl" and saved_history and saved_history.is_file() else p
            if not source.is_file():
                continue
            kept = [ln for ln in source.read_text().splitlines() if _record_step(ln) is not None
                    and _record_step(ln) <= step]
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text("".join(ln + "\n" for ln in kept))
            os.replace(tmp, p)

    def history(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(ln) for ln in self.path.read_text().splitlines() if _record_step(ln) is not None]

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
