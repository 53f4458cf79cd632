"""Does full fine-tuning learn with bfloat16 weights as in float32? The addition recipe, each way, same seeds.

    python -m benchmarks.learning.bf16_learn --seeds 0 1 2 --variants float32 bf16-master bf16-plain   # on this CPU
    python -m benchmarks.learning.bf16_learn --seeds 0 1 2 --variants float32 bfloat16 --device cuda   # on a GPU

Per variant and seed: ``slimgrpo train examples/smollm2_addition.yaml`` (the recipe's settings: full
fine-tuning at learning rate 1e-5, 40 steps) with

- ``float32``: ``model.dtype=float32`` (the recipe as it is);
- ``bfloat16``: ``model.dtype=bfloat16`` and the default update (``memory.bf16_update=auto``: float32 master
  weights with AdamW); ``--extra`` adds overrides to it (e.g. ``memory.bf16_update=plain``);
- ``bf16-master`` / ``bf16-plain``: float32 compute with the trained weights stored as bfloat16 values, through
  the master copy or rounded after each plain step (children/bf16_storage.py: a CPU without bfloat16 matrix
  kernels runs a real bfloat16 model 20-30x slower),

then the trained model is scored on the recipe's held-out questions by the learning suite's evaluator
(``slimgrpo eval``, 4 samples per question at the recipe's temperature, and greedy; the saved weights are read
in float32 for every variant, so only training differs).

Results are kept in OUT/results.json as each run finishes; a run already there is not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap
from benchmarks.harness.paths import BENCH_DIR, REPO_ROOT
from benchmarks.harness.processes import child_command, child_env
from benchmarks.harness.records import read_jsonl
from benchmarks.learning import runs

RECIPE = REPO_ROOT / "examples" / "smollm2_addition.yaml"
CODE = RECIPE.with_suffix(".py")
VARIANTS = ("float32", "bfloat16", "bf16-master", "bf16-plain")


def train(variant: str, seed: int, args, train_file: Path, run_dir: Path) -> dict:
    """One training run as the learning suite runs it, with the trained weights as ``variant`` says."""
    dtype = "bfloat16" if variant == "bfloat16" else "float32"
    overrides = [str(RECIPE), f"model.path={args.model}", f"data.path={train_file}", f"run.output_dir={run_dir}",
                 f"run.seed={seed}", f"run.num_threads={args.num_threads}", f"model.dtype={dtype}",
                 f"run.device={args.device}", "log.progress=false", "log.log_completions_steps=0",
                 "run.save_checkpoints=false", *(args.extra if variant == "bfloat16" else [])]
    if variant.startswith("bf16-"):
        mode = {"bf16-master": "fp32_master", "bf16-plain": "plain"}[variant]
        cmd = child_command("bf16_storage", mode, "train", *overrides)
    else:
        cmd = runs.slimgrpo_cmd("train", *overrides)
    # every variant with the child's environment (this checkout's slimgrpo), so that only the weights differ
    run = run_measured(cmd, run_dir.with_suffix(".log"), choose_memory_cap(None), f"{variant}-{seed}", env=child_env())
    if run.returncode != 0:
        raise SystemExit(f"{variant} seed {seed} failed ({run.error}); log: {run.log_path}")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    rewards = [r["reward"] for r in rows if "reward" in r and "step" in r]
    return {"wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mib, "rewards": rewards,
            "model": str(run_dir / "final")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variants", nargs="+", default=["float32", "bf16-master", "bf16-plain"], choices=VARIANTS)
    p.add_argument("--extra", nargs="*", default=[], help="overrides for the bfloat16 runs")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", type=Path, default=REPO_ROOT / "models" / "smollm2")
    p.add_argument("--num-threads", type=int, default=os.cpu_count())
    p.add_argument("--out", type=Path, default=BENCH_DIR / "runs" / "bf16_learn")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    train_file, heldout = runs.make_data(CODE, args.out / "data")
    if "base" not in results:
        results["base"] = _scores(runs.evaluate(RECIPE, args.model, heldout, args.out / "base", args.num_threads))
        results_path.write_text(json.dumps(results, indent=1))
    for seed in args.seeds:
        for variant in args.variants:
            key = f"{variant}/{seed}"
            if key in results:
                continue
            run_dir = args.out / f"{variant}-{seed}"
            run = train(variant, seed, args, train_file, run_dir)
            run.update(_scores(runs.evaluate(RECIPE, Path(run["model"]), heldout, run_dir.with_name(
                f"{variant}-{seed}-eval"), args.num_threads)), extra=args.extra if variant == "bfloat16" else [],
                device=args.device)
            results[key] = run
            results_path.write_text(json.dumps(results, indent=1))
            print(f"{key}: sampled {run['sampled_accuracy']:.3f} greedy {run['greedy_accuracy']:.3f} "
                  f"({run['wall_s']:.0f} s)", flush=True)
    print(table(results))
    return 0


def _scores(evaluated: dict) -> dict:
    return {k: evaluated[k] for k in ("sampled_accuracy", "greedy_accuracy")}


def table(results: dict) -> str:
    """Markdown: held-out accuracy per dtype and seed, with the mean."""
    base = results.get("base", {})
    lines = ["| trained weights | seed | held-out sampled | held-out greedy | mean reward, last 10 steps | train wall s |",
             "|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| base model | - | {base['sampled_accuracy']:.3f} | {base['greedy_accuracy']:.3f} | - | - |")
    for dtype in VARIANTS:
        runs = sorted((k, v) for k, v in results.items() if k.startswith(dtype + "/"))
        for key, run in runs:
            last = run["rewards"][-10:]
            lines.append(f"| {dtype} | {key.split('/')[1]} | {run['sampled_accuracy']:.3f} | "
                         f"{run['greedy_accuracy']:.3f} | {statistics.mean(last):.3f} | {run['wall_s']:.0f} |")
        if runs:
            s = statistics.mean(r["sampled_accuracy"] for _, r in runs)
            g = statistics.mean(r["greedy_accuracy"] for _, r in runs)
            lines.append(f"| {dtype} | mean of {len(runs)} | {s:.3f} | {g:.3f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
