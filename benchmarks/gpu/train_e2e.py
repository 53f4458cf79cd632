"""(b) of the first GPU call: ``slimgrpo train`` end to end on a tiny random model (bf16 LoRA, beta 0.04,
``loss.num_iterations=2``, completions that stop at EOS, checkpoints, ``memory.budget=auto``, checkpoints
offloaded to pinned host memory), then one more step in a second process resumed from the checkpoint; the run's
plan against the process's peak allocated, peak reserved and pinned host bytes. Tasks ``train`` and ``resume``;
with ``ctx["dry_run"]`` they make the model folder, the config and the plan, and train nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.workloads import setup_device, setup_dtype, synthetic_corpus
from benchmarks.harness.builders import build_model_folder

MIB = 2**20

# A tiny Qwen2 whose checkpointed layer inputs (16 rows x 160 tokens x 512 x 2 bytes = 2.5 MiB) pass the
# offload's 1 MiB threshold, so pinned host memory is really used; a small vocabulary, so a random model
# ends a good share of its completions at EOS within 96 tokens.
TINY = {"family": "qwen2", "hidden": 512, "intermediate": 1024, "layers": 4, "heads": 8, "kv_heads": 4,
        "vocab": 512, "tie": True, "max_positions": 1024}
TINY_SMOKE = {**TINY, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "layers": 2}
TRAIN_STEPS = 4  # the first process; the resume process trains one more


def train_files(ctx: dict) -> tuple[Path, list[str]]:
    """The tiny model folder, prompts and config of the end-to-end run (made once, reused by ``resume``).
    Returns (config path, the overrides both processes pass)."""
    root = ctx["work"] / "train_e2e"
    cfg_path = root / "cfg.yaml"
    if cfg_path.is_file() and ctx["task"] == "resume":
        return cfg_path, json.loads((root / "overrides.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    smoke = ctx["smoke"] and not ctx["dry_run"]  # a CPU run of the plumbing: smaller still
    model = build_model_folder(TINY_SMOKE if smoke else TINY, dtype=setup_dtype(ctx), root=ctx["work"] / "models",
                               corpus=synthetic_corpus())
    corpus = synthetic_corpus()
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": corpus[i][:160], "answer": str(i % 41)}) + "\n" for i in range(64)))
    # A reward that tells completions apart (the built-in length reward scores every short completion 1,
    # and equal rewards leave GRPO nothing to update with).
    (root / "suite_rewards.py").write_text(
        "def vowels(prompts, completions, **kwargs):\n"
        "    return [sum(ch in 'aeiou' for ch in c) / max(len(c), 1) for c in completions]\n")
    import yaml

    cfg = {"model": {"path": str(model), "dtype": setup_dtype(ctx)},
           "data": {"path": str(root / "prompts.jsonl"), "max_prompt_length": 64},
           "rollout": {"num_generations": 4 if smoke else 8,
                       "max_completion_length": 24 if smoke else 96},  # stops at EOS (no minimum)
           "rewards": {"functions": [str(root / "suite_rewards.py") + ":vowels"]},
           "loss": {"beta": 0.04, "num_iterations": 2},
           "lora": {"enabled": True, "r": 16, "alpha": 32},
           "memory": {"budget": "auto", "gradient_checkpointing": True, "offload_activations": True},
           "optim": {"learning_rate": 1e-4},
           "run": {"max_steps": TRAIN_STEPS, "save_steps": 2, "batch_size": 8 if smoke else 16, "output_dir": str(root / "run"),
                   "seed": 0, "device": setup_device(ctx)},
           "log": {"progress": False}}
    cfg_path.write_text(yaml.safe_dump(cfg))
    overrides: list[str] = []
    (root / "overrides.json").write_text(json.dumps(overrides))
    return cfg_path, overrides


def run_plan(cfg_path: Path, overrides: list[str], device: str) -> dict[str, Any]:
    """The plan ``slimgrpo plan CONFIG --device DEVICE`` prints, as numbers (the same functions: config ->
    plan inputs -> plan_memory); memory.budget=auto changes nothing for a model this small."""
    from benchmarks.surface import load_config, plan_memory, run_spec, shape_of

    cfg = load_config(str(cfg_path), list(overrides), validate=False)
    shape = shape_of(cfg)
    plan = plan_memory(shape, run_spec(cfg, device, vocab=shape.vocab))
    return {"plan_mib": plan.tensor_peak_bytes / MIB, "plan_with_overhead_mib": plan.peak_bytes / MIB,
            "plan_phase": plan.peak_phase, "plan_host_mib": plan.host_bytes / MIB}


def _metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _process_peaks(dev) -> dict[str, Any]:
    import torch

    from benchmarks.gpu.measure import host_stats

    if dev.type != "cuda":
        return {"peak_alloc_mib": None, "peak_reserved_mib": None}
    torch.cuda.synchronize()
    return {"peak_alloc_mib": torch.cuda.max_memory_allocated() / MIB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved() / MIB, **host_stats()}


def _train_row(ctx: dict, max_steps: int, fresh: bool) -> dict[str, Any]:
    """``slimgrpo train CONFIG run.max_steps=N`` in this process (cli.main, as the command line runs it),
    then what the run wrote and this process's CUDA and pinned-host peaks against the plan."""
    from benchmarks.surface import cli_main as main

    cfg_path, overrides = train_files(ctx)
    run = cfg_path.parent / "run"
    if fresh:
        shutil.rmtree(run, ignore_errors=True)
    plan = run_plan(cfg_path, overrides, setup_device(ctx))
    if ctx["dry_run"]:
        return {**plan, "status": "dry run: tiny model, config and plan made; nothing trained",
                "config": str(cfg_path)}
    t = time.perf_counter()
    rc = main(["train", str(cfg_path), *overrides, f"run.max_steps={max_steps}"])
    seconds = time.perf_counter() - t
    row: dict[str, Any] = {**plan, **_process_peaks(ctx["dev"]), "exit_code": rc, "train_s": seconds}
    metrics = _metrics(run)
    steps = [m.get("step") for m in metrics]
    row.update(steps_logged=len(metrics), last_step=steps[-1] if steps else None,
               checkpoints=sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")),
               final_saved=(run / "final").is_dir(),
               metric_peak_mib=max((m.get("memory/peak_mib") or 0 for m in metrics), default=None),
               metric_reserved_mib=max((m.get("memory/peak_reserved_mib") or 0 for m in metrics), default=None),
               metric_pinned_mib=max((m.get("memory/pinned_host_peak_mib") or 0 for m in metrics), default=None),
               clipped_ratio=[m.get("completions/clipped_ratio") for m in metrics],
               mean_length=[m.get("completions/mean_length") for m in metrics],
               kl=[m.get("kl") for m in metrics])
    if row.get("peak_alloc_mib"):
        row["ratio"] = row["plan_mib"] / row["peak_alloc_mib"]
    if row.get("pinned_peak_mib") is not None:
        row["host_ratio"] = (row["plan_host_mib"] / row["pinned_peak_mib"]) if row["pinned_peak_mib"] else None
    problems = []
    if rc != 0:
        problems.append(f"exit code {rc}")
    if steps != list(range(1, max_steps + 1)):
        problems.append(f"steps logged {steps}, expected 1..{max_steps}")
    if not row["final_saved"]:
        problems.append("no final/ folder")
    clipped = [c for c in row["clipped_ratio"] if c is not None]
    if clipped and min(clipped) >= 1.0 and not ctx["smoke"]:  # a few rows on CPU may all run to the end
        problems.append("no completion stopped at EOS")
    if problems and ctx["remaining"]() <= 0:  # the time limit's Budget, raised inside the run, ended it
        row["status"] = f"skipped: budget (the run was stopped at its time limit after {seconds:.0f} s)"
    else:
        row["status"] = "ok" if not problems else "failed: " + "; ".join(problems)
    return row


def task_train(ctx: dict) -> dict:
    row = ctx["run"](f"train {TRAIN_STEPS} steps (bf16 LoRA, beta 0.04, num_iterations 2, offload, budget auto)",
                     lambda: _train_row(ctx, TRAIN_STEPS, fresh=True))
    return {"rows": [row]}


def task_resume(ctx: dict) -> dict:
    run = ctx["work"] / "train_e2e" / "run"
    if not ctx["dry_run"] and not (run / "checkpoints" / f"checkpoint-{TRAIN_STEPS}").is_dir():
        return {"rows": [], "status": f"skipped: no checkpoint-{TRAIN_STEPS} from the train task to resume"}
    row = ctx["run"](f"resume from checkpoint-{TRAIN_STEPS}, one more step (a new process)",
                     lambda: _train_row(ctx, TRAIN_STEPS + 1, fresh=False))
    return {"rows": [row]}
