"""What a training run says in the terminal: a start banner, the end summary with next steps, and
silence from third-party libraries unless ``log.verbose=true``. Only rank 0 prints under torchrun."""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any

from slimgrpo.output.metrics import describe_eval
from slimgrpo.rewards.loading import reward_label
from slimgrpo.units import human_count, human_duration


class _OwnMessagesOnly(logging.Filter):
    """On the root handler: slimgrpo's records at any level, other libraries' only from ERROR up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] == "slimgrpo" or record.levelno >= logging.ERROR


def quiet_third_party(verbose: bool) -> None:
    """Hide warnings and info logs of transformers, torch, peft, datasets (our ``slimgrpo`` logger stays)."""
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"^(?!slimgrpo)")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"^(?!slimgrpo)")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"^(?!slimgrpo)")
    for name in ("transformers", "torch", "torchao", "peft", "datasets", "accelerate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)  # torch's loggers have their own handlers
    for handler in logging.getLogger().handlers:  # e.g. torchao's "Failed to load ..." at import
        if not any(isinstance(f, _OwnMessagesOnly) for f in handler.filters):
            handler.addFilter(_OwnMessagesOnly())
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # transformers not importable: nothing to silence
        pass


def banner_lines(cfg, policy, world_size: int, start_step: int, eval_prompts: int | None,
                 output_dir) -> list[str]:
    """The start banner: the model and what trains, the device, the batch, the steps (``start_step``: the step
    a resumed run goes on from), the held-out evaluation (``eval_prompts``: its prompt count, None without
    one), the run folder."""
    params = list(policy.model.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    share = f" ({trainable / total:.2%})" if total and trainable < total else ""
    kind = f"LoRA r={cfg.lora.r}" if cfg.lora.enabled else "full fine-tuning"
    dtype = str(policy.dtype).replace("torch.", "")
    world = world_size
    device = f"{policy.device}" + (f" x {world} processes ({cfg.distributed.strategy})" if world > 1 else "")
    lines = [
        f"slimgrpo train: {cfg.model.path}",
        f"  parameters  {human_count(trainable)} trainable of {human_count(total)}{share}, {kind}",
        f"  device      {device}, {dtype}",
        f"  batch       {cfg.prompts_per_step} prompts x {cfg.rollout.num_generations} generations = "
        f"{cfg.run.batch_size} completions per step, up to {cfg.rollout.max_completion_length} tokens each",
        f"  steps       {cfg.run.max_steps}" + (f" (resuming after step {start_step})" if start_step else "")
        + f"; rewards: {', '.join(reward_label(f) for f in cfg.rewards.functions)}",
    ]
    if eval_prompts is not None:
        when = f"every {cfg.eval.steps} steps" if cfg.eval.steps else "before and after training"
        lines.append(f"  eval        {eval_prompts} held-out prompts x {cfg.eval.num_samples} samples, {when}")
    lines.append(f"  output      {output_dir}")
    return lines


def print_banner(is_main: bool, lines: list[str]) -> None:
    if is_main:
        print("\n".join(lines), flush=True)


def print_eval(is_main: bool, num_prompts: int, label: str, metrics: dict[str, Any]) -> None:
    """One held-out evaluation (``describe_eval``) with its prompt count; rank 0 only."""
    if is_main and metrics:
        n = num_prompts
        print(f"eval {label}: {describe_eval(metrics)}  ({n} held-out {'prompt' if n == 1 else 'prompts'})", flush=True)


def _first_last(history: list[dict[str, Any]], key: str) -> tuple[float, float] | None:
    vals = [r[key] for r in history if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return (vals[0], vals[-1]) if vals else None


def summary_lines(summary: dict[str, Any], cfg, history: list[dict[str, Any]], wall_s: float | None) -> list[str]:
    """The end of a run: what happened and where to look next."""
    out = cfg.run.output_dir
    steps = summary.get("steps", 0)
    if summary.get("already_finished"):  # a finished run started again (safe re-runs): nothing was trained
        return [f"already finished at step {steps}; nothing to do (run folder {out})",
                f"  report      slimgrpo report {out}"]
    if summary.get("preempted_by"):
        head = f"stopped by {summary['preempted_by']} at step {steps} of {cfg.run.max_steps}"
    elif steps < cfg.run.max_steps:  # a callback, or learning stalled (run.stop_on_stall: said below)
        head = f"stopped at step {steps} of {cfg.run.max_steps}"
    else:
        head = f"done: {steps} steps"
    if wall_s is not None:
        head += f" in {human_duration(wall_s)}"
    if summary.get("stopped_by") == "stall":
        head += ": learning stalled (run.stop_on_stall=true, exit code 5)"
    if summary.get("stopped_by") == "early_stopping":
        head += (f": early stopping, {summary.get('best_metric')} stopped improving "
                 f"(run.early_stopping_patience={summary.get('early_stopping_patience')})")
    lines = [head]
    r = _first_last([h for h in history if "reward" in h], "reward")
    if r:
        lines.append(f"  reward      {r[0]:.3f} -> {r[1]:.3f} (first -> last step)")
    after_step = summary.get("eval_after/step")
    when = "after" if after_step == steps else f"step {after_step}"
    for key, label in (("accuracy_greedy", "greedy"), ("accuracy_sampled", "sampled")):
        before, after = summary.get(f"eval_before/{key}"), summary.get(f"eval_after/{key}")
        if isinstance(after, (int, float)):
            text = f"{before:.1%} -> {after:.1%}" if isinstance(before, (int, float)) else f"{after:.1%}"
            lines.append(f"  eval        {label} accuracy {text} (held-out, before -> {when})")
    if summary.get("eval_skipped_at_step") is not None:  # stopped early: say so, never show "before" as "after"
        lines.append(f"  eval        skipped after step {steps} (the run stopped early); the held-out evaluation "
                     "runs after the last step when the resumed run finishes")
    lines += _stall_lines(summary)
    lines.append(f"  report      slimgrpo report {out}")
    final = os.path.join(out, "final")
    if os.path.isdir(final):
        lines.append(f"  model       {final}{_which_model(summary, cfg)}")
    elif summary.get("preempted_by"):
        lines.append(f"  checkpoint  {os.path.join(out, 'checkpoints')} (run the same command again to resume)")
    return lines


def _which_model(summary: dict[str, Any], cfg) -> str:
    """Which step's model ``final/`` holds (``run.keep_best``), said once at the end."""
    if not cfg.run.keep_best:
        how = "" if cfg.eval.data else " with eval.data"
        return f" (the last step's; run.keep_best=true{how} keeps the best one)"
    value, step, last = summary.get("best_value"), summary.get("final_step"), summary.get("steps")
    if summary.get("best_checkpoint_problem"):
        return f" (the last step's: the best checkpoint is damaged, {summary['best_checkpoint_problem']})"
    shown = f"{value:.4g}" if isinstance(value, (int, float)) else "?"
    where = "before training" if step == 0 else f"step {step}"
    if step == last:
        return f" (the best: the last step's, {summary.get('best_metric')} {shown})"
    return (f" (the best: {where}, {summary.get('best_metric')} {shown}; the last step's model is in "
            f"{os.path.join(cfg.run.output_dir, 'last')})")


STALL_KINDS = {"no_signal": "most groups had rewards all equal (no gradient)",
               "entropy_collapse": "entropy collapsed while the reward stayed flat",
               "slide": "entropy collapsed while the reward or the held-out metric fell"}


def _stall_lines(summary: dict[str, Any]) -> list[str]:
    """Each stalled stretch of the run (monitor/stall.py) and, for a run stopped on one, the checkpoint to go
    back to."""
    lines = []
    for s in summary.get("stalls") or []:
        what = STALL_KINDS.get(s.get("kind"), s.get("kind"))
        lines.append(f"  stalled     steps {s.get('start_step')}-{s.get('end_step')}: {what}")
    if summary.get("stopped_by") == "stall":
        kept = summary.get("stall_checkpoint")
        lines.append(f"  checkpoint  {kept} (the last from before the stall)" if kept else
                     "  checkpoint  none from before the stall (run.save_steps sets how often one is saved)")
    return lines


def print_end_summary(summary: dict[str, Any], cfg) -> None:
    from pathlib import Path

    from slimgrpo.distributed.context import from_environment

    if not from_environment().is_main:
        return
    path = Path(cfg.run.output_dir) / "metrics.jsonl"
    history = []
    if path.is_file():
        import json

        for line in path.read_text().splitlines():
            try:
                history.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    print("\n".join(summary_lines(summary, cfg, history, summary.get("wall_time_s"))), flush=True)
