"""What a run does with its output folder: resume, start afresh, refuse, or say it is already finished.

Decided before anything is written into the folder:

* ``run.resume=auto`` (default) continues from the newest complete checkpoint, but only when the config
  differs from the one that checkpoint was saved with in nothing but :data:`RESUMABLE_KEYS`; otherwise
  it is refused with the differing keys (old -> new). A run that already reached ``run.max_steps``
  (checkpoint at that step, ``final/`` and ``summary.json`` written) is reported as finished and nothing
  is rewritten; raising ``run.max_steps`` continues it.
* A fresh start (``run.resume=never``, or ``auto`` in a folder holding a finished run without
  checkpoints) in a folder that holds run files is refused unless ``run.overwrite=true``, which **moves
  the whole folder aside** to ``<output_dir>.old-<YYYYmmdd-HHMMSS>`` (a sibling folder; nothing is
  deleted) and starts in a new, empty one.
* A folder holding only the files of an attempt stopped before its first checkpoint (metrics, config)
  is restarted from step 0 with a warning.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slimgrpo.checkpoint import format as ckpt
from slimgrpo.checkpoint.run_lock import RunFolderError, RunLock, folder_error

log = logging.getLogger("slimgrpo")

# Keys that may change between a run and its continuation: run length and saving, logging, timeouts,
# memory-only settings (same numbers, different peak memory) and how reward faults are handled.
RESUMABLE_KEYS = (
    "run.max_steps", "run.save_steps", "run.save_total_limit", "run.save_checkpoints", "run.save_model",
    "run.resume", "run.overwrite", "run.output_dir", "run.num_threads", "run.thread_wait_policy", "run.device",
    "run.max_nonfinite_steps", "run.max_collapsed_steps", "run.collapse_entropy_ratio", "run.collapse_grad_norm_min",
    "run.collapse_grad_norm_max", "run.stall_steps", "run.stall_zero_std_fraction", "run.stall_entropy_ratio",
    "run.stall_reward_flat", "run.stop_on_stall", "run.full_determinism", "run.keep_best", "run.best_metric",
    "run.greater_is_better", "run.early_stopping_patience", "run.early_stopping_threshold",
    "log.*", "eval.*", "distributed.timeout_s", "distributed.backend",
    "rewards.timeout_s", "rewards.isolation", "rewards.on_error", "rewards.max_failed_steps",
    "memory.micro_batch_size", "memory.gradient_checkpointing", "memory.offload_activations", "memory.budget",
    "memory.fit", "memory.share_prompt_forward", "memory.tiled_mlp", "memory.host_budget", "loss.token_chunk",
    "loss.vocab_chunk", "loss.fuse_head_loss",
    "rollout.max_batch_rows",
)
# Files a run writes at the top of its folder; any of them marks the folder as used.
RUN_FILES = ("checkpoints", "final", "summary.json", "metrics.jsonl", "completions.jsonl", "config.yaml")


class ResumeConfigError(RunFolderError):
    """The config differs from the checkpoint's in keys that cannot change within one run."""

    def __init__(self, message: str, differences: list[tuple[str, Any, Any]]):
        super().__init__(message)
        self.differences = differences


class FolderInUseError(RunFolderError):
    """A fresh start would overwrite an earlier run's files (``run.overwrite=false``)."""


@dataclass
class Plan:
    resume_from: Path | None = None  # checkpoint to load; None = start at step 0
    finished: dict[str, Any] | None = None  # the saved summary when the run already reached max_steps


def is_resumable_key(key: str) -> bool:
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUMABLE_KEYS)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Keys (present in both) whose values differ and that are not resumable: ``[(key, old, new)]``."""
    from slimgrpo.config.paths import CODE_KEYS, PATH_KEYS, same_path

    # A folder from before paths were stored absolute holds them as written: the same path, not a change.
    old, new = _flat(saved), _flat(current)
    return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys())
            if old[k] != new[k] and not is_resumable_key(k)
            and not (k.startswith(PATH_KEYS + CODE_KEYS) and same_path(old[k], new[k]))]


def current_config_dict(cfg) -> dict[str, Any]:
    """The config as config.yaml stores it (secrets scrubbed, YAML types; a Python object from the API as
    config.yaml names it, so a script's run resumes as a YAML's does)."""
    from slimgrpo.config.parse import plain_config

    return yaml.safe_load(yaml.safe_dump(plain_config(cfg), sort_keys=False))


def used_files(output_dir: Path) -> list[str]:
    found = []
    for name in RUN_FILES:
        p = output_dir / name
        if p.is_dir() and any(p.iterdir()) or p.is_file():
            found.append(name + ("/" if p.is_dir() else ""))
    return found


def open_folder(output_dir: Path) -> RunLock:
    """Create the run folder when needed and take its lock (rank 0 only)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise RunFolderError(f"run.output_dir {output_dir} is a file, not a folder: give a folder path "
                             "(it is created when missing), e.g. run.output_dir=outputs/my-run")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / ".slimgrpo-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise folder_error(output_dir, e) from None
    return RunLock(output_dir).acquire()


def _read_yaml(path: Path) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _read_summary(output_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((output_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _fresh_hint(output_dir: Path) -> str:
    return (f"to start afresh, use run.resume=never run.overwrite=true (moves the old run aside to "
            f"{output_dir}.old-<time>, deleting nothing) or give a new run.output_dir")


def check_config(cfg, saved_config: Path, where: str, output_dir: Path, explicit: bool = False) -> None:
    """Refuse a resume whose config differs in non-resumable keys; a checkpoint named explicitly
    (``run.resume=PATH``) is a deliberate choice: the differences are only logged."""
    saved = _read_yaml(saved_config)
    if saved is None:
        return  # old checkpoints without config.yaml: the weight/optimizer checks still apply
    diff = config_differences(saved, current_config_dict(cfg))
    if not diff:
        return
    listed = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in diff)
    if explicit:
        log.warning("resuming %s, named by run.resume, with a changed config: %s", where, listed)
        return
    named = ""
    if where.startswith("from "):
        named = (" (or, to continue it with these changes on purpose, name the checkpoint: "
                 f"run.resume={where[len('from '):]})")
    raise ResumeConfigError(
        f"cannot resume {where}: this config differs from the one it was trained with in {listed}. "
        f"To continue that run, set these back{named}; {_fresh_hint(output_dir)}. Keys that may change on resume: "
        "run.max_steps, run.save_*, log.*, timeouts and memory-only settings (docs/checkpoints.md).", diff)


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def plan(cfg, output_dir: Path, base_path) -> Plan:
    """Decide without writing anything (every rank can call it; raises RunFolderError subclasses)."""
    spec = cfg.run.resume
    if spec == "never":
        used = used_files(output_dir)
        if used:
            raise FolderInUseError(
                f"run.resume=never starts afresh, but {output_dir} holds an earlier run ({', '.join(used)}); "
                f"nothing was changed. To continue it, use run.resume=auto; {_fresh_hint(output_dir)}.")
        return Plan()
    if spec != "auto":
        path = Path(base_path(spec))
        if not ckpt.is_valid(path):
            raise RunFolderError(f"run.resume={spec!r}: {path} is not a usable slimgrpo checkpoint "
                                 f"({ckpt.problem(path)}); point it at a checkpoints/checkpoint-<step> folder, "
                                 "or use run.resume=auto")
        check_config(cfg, path / "config.yaml", f"from {path}", output_dir, explicit=True)
        return Plan(resume_from=path)
    path = ckpt.find_resume_checkpoint(output_dir)
    summary = _read_summary(output_dir)
    if path is not None:
        check_config(cfg, path / "config.yaml", f"from {path}", output_dir)
        step = ckpt.checkpoint_step(path)
        final_ok = (output_dir / "final").is_dir() or not cfg.run.save_model
        stopped_early = bool(summary) and summary.get("stopped_by") == "early_stopping"  # run.early_stopping_*
        if (step >= cfg.run.max_steps or stopped_early) and final_ok and summary and summary.get("steps") == step:
            return Plan(resume_from=path, finished=summary)
        return Plan(resume_from=path)
    finished_files = [n for n in ("final", "summary.json") if (output_dir / n).exists()]
    if finished_files:
        if summary and summary.get("steps", -1) >= cfg.run.max_steps and (output_dir / "config.yaml").is_file():
            check_config(cfg, output_dir / "config.yaml", f"the run in {output_dir}", output_dir)
            return Plan(finished=summary)
        raise FolderInUseError(
            f"{output_dir} holds a run ({', '.join(finished_files)}) but no checkpoint to continue from "
            f"(run.save_checkpoints=false, or they were removed); nothing was changed. {_fresh_hint(output_dir)}"
            .replace(". to start", ". To start"))
    if (output_dir / "metrics.jsonl").is_file():
        log.warning("%s holds the metrics of an attempt that stopped before its first checkpoint: starting "
                    "again from step 0 (they are replaced)", output_dir)
    return Plan()


def move_aside(output_dir: Path, lock: RunLock) -> tuple[Path, RunLock]:
    """Rename ``output_dir`` to ``<output_dir>.old-<time>``, make a new empty one and lock it."""
    here = Path.cwd().resolve()
    target = output_dir.resolve()
    if here == target or target in here.parents:
        raise RunFolderError(f"run.overwrite=true would move {output_dir} aside, but it holds the current "
                             "folder: give the run its own run.output_dir")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = output_dir.with_name(f"{output_dir.name}.old-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = output_dir.with_name(f"{output_dir.name}.old-{stamp}-{n}")
    try:
        os.rename(output_dir, aside)
    except OSError as e:
        raise folder_error(output_dir, e) from None
    new_lock = open_folder(output_dir)
    lock.release()
    log.warning("run.overwrite=true: moved the earlier run in %s aside to %s (nothing deleted)", output_dir, aside)
    return aside, new_lock


def prepare(cfg, output_dir: Path, lock: RunLock | None, base_path) -> tuple[Plan, RunLock | None]:
    """Rank 0: plan, and with ``run.overwrite=true`` move an earlier run aside instead of refusing."""
    try:
        return plan(cfg, output_dir, base_path), lock
    except FolderInUseError:
        if not cfg.run.overwrite or lock is None:
            raise
    _, lock = move_aside(output_dir, lock)
    return plan(cfg, output_dir, base_path), lock
