"""Planner calibration: predicted peak memory against the peak RSS of real slimgrpo runs (CPU).

    python benchmarks/calibrate_memory.py              # the default configurations
    python benchmarks/calibrate_memory.py --steps 2 --out .bench/calibration.json

Each configuration trains for a few steps in its own process (completion length pinned with
min = max so the work is fixed); peak RSS is read from outside the process (getrusage of the finished
child, see common.run_measured). The prediction is `slimgrpo plan` for the same config. Goal (issue
"Memory plan"): every prediction within +-15% of the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH_DIR, REPO_ROOT, build_model_folder, choose_memory_cap, machine_info, run_measured  # noqa: E402

W_CPU = {"family": "qwen2", "vocab": 151_936, "hidden": 128, "intermediate": 512, "layers": 2, "heads": 4,
         "kv_heads": 2, "tie": True, "max_positions": 4096}
DEEP = {"family": "llama", "vocab": 32_000, "hidden": 512, "intermediate": 1536, "layers": 8, "heads": 8,
        "kv_heads": 4, "tie": False, "max_positions": 4096}

# name, shape, overrides
CONFIGS = [
    ("wcpu-full-256", W_CPU, ["rollout.max_completion_length=256"]),
    ("wcpu-full-1024", W_CPU, ["rollout.max_completion_length=1024"]),
    ("wcpu-full-beta", W_CPU, ["rollout.max_completion_length=256", "loss.beta=0.04"]),
    ("wcpu-lora-beta", W_CPU, ["rollout.max_completion_length=256", "loss.beta=0.04", "lora.enabled=true"]),
    ("deep-full-512", DEEP, ["rollout.max_completion_length=512"]),
    ("deep-full-ckpt-512", DEEP, ["rollout.max_completion_length=512", "memory.gradient_checkpointing=true"]),
    ("deep-lora-ckpt-512", DEEP, ["rollout.max_completion_length=512", "lora.enabled=true",
                                  "memory.gradient_checkpointing=true"]),
    ("deep-full-micro2-512", DEEP, ["rollout.max_completion_length=512", "memory.micro_batch_size=2",
                                    "loss.beta=0.04"]),
]


def base_config(model_dir: Path, prompts: Path, out_dir: Path, steps: int) -> dict:
    return {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"path": str(prompts), "max_prompt_length": 128},
        "rollout": {"num_generations": 8},
        "rewards": {"functions": [str(REPO_ROOT / "benchmarks" / "_rewards.py") + ":digit_reward"]},
        "optim": {"learning_rate": 1e-5},
        "run": {"max_steps": steps, "batch_size": 8, "output_dir": str(out_dir), "device": "cpu",
                "save_checkpoints": False, "save_model": False, "resume": "never"},
        "log": {"progress": False, "log_completions_steps": 0},
    }


def predict(cfg_path: Path, overrides: list[str]) -> int:
    from slimgrpo.config import load_config
    from slimgrpo.memory.cli import plan_inputs, shape_of
    from slimgrpo.memory.planner import plan_memory

    cfg = load_config(cfg_path, overrides)
    shape = shape_of(cfg)
    return plan_memory(shape, plan_inputs(cfg, "cpu", vocab=shape.vocab)).peak_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="run only these configuration names")
    ap.add_argument("--out", help="write results as JSON")
    args = ap.parse_args()

    from common import write_prompts

    prompts = write_prompts(BENCH_DIR / "calib_prompts.jsonl", 16)
    cap = choose_memory_cap(None)
    rows = []
    for name, shape, overrides in CONFIGS:
        if args.only and name not in args.only:
            continue
        model_dir = build_model_folder(shape)
        run_dir = BENCH_DIR / "calibration" / name
        cfg_path = run_dir.with_suffix(".yaml")
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(yaml.safe_dump(base_config(model_dir, prompts, run_dir, args.steps)))
        length = next(o.split("=")[1] for o in overrides if o.startswith("rollout.max_completion_length"))
        overrides = overrides + [f"rollout.min_completion_length={length}"]
        predicted = predict(cfg_path, overrides)
        t0 = time.perf_counter()
        outcome = run_measured([sys.executable, "-m", "slimgrpo", "train", str(cfg_path), *overrides],
                               run_dir.with_suffix(".log"), cap, f"calib-{name}")
        measured = (outcome.peak_rss_mib or 0) * 2**20
        ratio = predicted / measured if measured else float("nan")
        rows.append({"name": name, "predicted_mib": predicted / 2**20, "measured_mib": measured / 2**20,
                     "ratio": ratio, "ok": outcome.returncode == 0, "error": outcome.error,
                     "wall_s": time.perf_counter() - t0})
        print(f"{name:22s} predicted {predicted / 2**20:8.0f} MiB  measured {measured / 2**20:8.0f} MiB  "
              f"ratio {ratio:5.2f}  {'ok' if outcome.returncode == 0 else outcome.error}", file=sys.stderr, flush=True)

    print("\n| configuration | predicted MiB | measured peak RSS MiB | predicted / measured | within ±15% |")
    print("|---|---:|---:|---:|:---:|")
    for r in rows:
        within = "yes" if abs(r["ratio"] - 1) <= 0.15 else "no"
        print(f"| {r['name']} | {r['predicted_mib']:,.0f} | {r['measured_mib']:,.0f} | {r['ratio']:.2f} | "
              f"{within if r['ok'] else 'run failed: ' + r['error']} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
