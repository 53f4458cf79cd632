"""Planner calibration: predicted peak memory against the peak RSS of real slimgrpo runs (CPU).

    python -m benchmarks.planner.calibrate_memory              # the default configurations
    python -m benchmarks.planner.calibrate_memory --steps 2 --out .bench/calibration.json

    python -m benchmarks.planner.calibrate_memory --only qwen05x2-lora-4k --cap 8GiB

Each configuration runs in its own process under a memory cap; peak RSS is read from outside the
process (getrusage of the finished child, see harness/measure.py). Two modes:

* train: `slimgrpo train` for a few steps (completion length pinned with min = max); prediction =
  the plan's peak.
* update: benchmarks/children/update_only.py, one real update (reference log-probs, forward + backward over the
  micro-batches, optimizer step with its state resident) on synthetic full-length completions, no
  decoding, so that long rows and real shapes fit in CPU time; prediction = always + update of the plan.
  Real shapes keep their width, heads, vocabulary and head; the layer count is cut (column "layers").

Goal (issue 12): every prediction within +-15% of the measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from benchmarks.harness.builders import build_model_folder, write_prompts
from benchmarks.harness.machine import machine_info
from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap, parse_size
from benchmarks.harness.paths import BENCH_DIR
from benchmarks.harness.processes import child_command, child_env
from benchmarks.harness.rewards import DIGIT_REWARD

W_CPU = {"family": "qwen2", "vocab": 151_936, "hidden": 128, "intermediate": 512, "layers": 2, "heads": 4,
         "kv_heads": 2, "tie": True, "max_positions": 4096}
DEEP = {"family": "llama", "vocab": 32_000, "hidden": 512, "intermediate": 1536, "layers": 8, "heads": 8,
        "kv_heads": 4, "tie": False, "max_positions": 4096}
# Real shapes (public config.json figures, random init) with fewer layers where stated: every layer has
# the real width, heads, vocabulary and head; only the depth is cut so that CPU time stays bounded.
QWEN05 = {"family": "qwen2", "vocab": 151_936, "hidden": 896, "intermediate": 4864, "layers": 24, "heads": 14,
          "kv_heads": 2, "tie": True, "max_positions": 32768}
LLAMA1B = {"family": "llama", "vocab": 128_256, "hidden": 2048, "intermediate": 8192, "layers": 16, "heads": 32,
           "kv_heads": 8, "tie": True, "max_positions": 131072}


def layers(shape: dict, n: int) -> dict:
    return {**shape, "layers": n}


def update(total: int, completion: int | None = None) -> list[str]:
    """Update-only overrides for rows of ``total`` tokens: ``completion`` tokens (default all but a
    128-token prompt) after a prompt of the rest. Long rows keep 512 completion tokens: the LM head
    (152K x 896 for Qwen2.5-0.5B) costs CPU time per completion token, the memory model is the same."""
    completion = total - 128 if completion is None else completion
    return [f"data.max_prompt_length={total - completion}", f"rollout.max_completion_length={completion}"]


Q2, L2, Q1 = layers(QWEN05, 2), layers(LLAMA1B, 2), layers(QWEN05, 1)
G2 = ["rollout.num_generations=2", "run.batch_size=2"]
G8 = ["rollout.num_generations=8", "run.batch_size=8"]
LORA, CKPT = ["lora.enabled=true"], ["memory.gradient_checkpointing=true"]

# name, shape, overrides, mode: "train" = real steps with decoding, "update" = children/update_only.py
# (synthetic full-length completions, no decode; prediction = always + update of the plan)
CONFIGS = [
    ("wcpu-full-256", W_CPU, ["rollout.max_completion_length=256"], "train"),
    ("wcpu-full-1024", W_CPU, ["rollout.max_completion_length=1024"], "train"),
    ("wcpu-full-beta", W_CPU, ["rollout.max_completion_length=256", "loss.beta=0.04"], "train"),
    ("wcpu-lora-beta", W_CPU, ["rollout.max_completion_length=256", "loss.beta=0.04", "lora.enabled=true"], "train"),
    ("deep-full-512", DEEP, ["rollout.max_completion_length=512"], "train"),
    ("deep-full-ckpt-512", DEEP, ["rollout.max_completion_length=512", "memory.gradient_checkpointing=true"], "train"),
    ("deep-lora-ckpt-512", DEEP, ["rollout.max_completion_length=512", "lora.enabled=true",
                                  "memory.gradient_checkpointing=true"], "train"),
    ("deep-full-micro2-512", DEEP, ["rollout.max_completion_length=512", "memory.micro_batch_size=2",
                                    "loss.beta=0.04"], "train"),
    ("qwen05x2-full-256", Q2, G2 + update(256), "update"),
    ("qwen05x2-lora-4k", Q2, G2 + update(4096) + LORA, "update"),
    ("qwen05x2-full-ckpt-4k", Q2, G2 + update(4096, 512) + CKPT, "update"),
    ("llama1bx2-lora-ckpt-4k", L2, G2 + update(4096, 512) + LORA + CKPT, "update"),
    ("qwen05x2-full-micro1-2k", Q2, G2 + update(2048, 512) + ["memory.micro_batch_size=1"], "update"),
    ("qwen05x2-full-tokens2k-2k", Q2, G2 + update(2048, 512) + ["memory.micro_batch_tokens=2048"], "update"),
    ("llama1bx2-lora-2k", L2, G2 + update(2048, 512) + LORA, "update"),
    ("qwen05x2-lora-ckpt-8k", Q2, G2 + update(8192, 512) + LORA + CKPT, "update"),
    ("llama1bx2-lora-ckpt-tokens-8k", L2, G2 + update(8192, 512) + LORA + CKPT + ["memory.micro_batch_tokens=8192"],
     "update"),
    ("qwen05x2-lora-eager-1k", Q2, G2 + update(1024, 512) + LORA + ["model.attn_implementation=eager"], "update"),
    ("qwen05x1-lora-ckpt-16k", Q1, G2 + update(16384, 256) + LORA + CKPT, "update"),
    # one group of 8 completions after a 2K-token prompt: the shared-prompt update (prompt run once)
    ("qwen05x2-shared8-2k", Q2, G8 + update(2048 + 256, 256), "update"),
]


def base_config(model_dir: Path, prompts: Path, out_dir: Path, steps: int) -> dict:
    return {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"path": str(prompts), "max_prompt_length": 128},
        "rollout": {"num_generations": 8},
        "rewards": {"functions": [DIGIT_REWARD]},
        "optim": {"learning_rate": 1e-5},
        "run": {"max_steps": steps, "batch_size": 8, "output_dir": str(out_dir), "device": "cpu",
                "save_checkpoints": False, "save_model": False, "resume": "never",
                "overwrite": True},  # a re-run moves the previous run folder aside
        "log": {"progress": False, "log_completions_steps": 0},
    }


def predict(cfg_path: Path, overrides: list[str], mode: str = "train") -> int:
    """The plan's peak; for update-only runs (no decoding) always + update. A train row is planned as `slimgrpo
    train` plans it, at its data's longest prompt; an update row's synthetic prompts are data.max_prompt_length."""
    from benchmarks.surface import data_prompt_tokens, load_config, plan_memory, run_spec, shape_of

    cfg = load_config(cfg_path, overrides)
    shape = shape_of(cfg)
    longest = data_prompt_tokens(cfg) if mode == "train" else None
    plan = plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=longest))
    if mode == "update":
        return plan.phase_total("always") + plan.phase_total("update")
    return plan.peak_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="run only these configuration names")
    ap.add_argument("--out", help="write results as JSON")
    ap.add_argument("--cap", default="8GiB", help="memory cap of each run (default 8GiB)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    ap.add_argument("--table-from", nargs="*", metavar="JSON",
                    help="measure nothing: re-predict the configurations measured in these --out files with the "
                         "current planner and print the table")
    args = ap.parse_args()

    prompts = write_prompts(BENCH_DIR / "calib_prompts.jsonl", 16)
    cap = choose_memory_cap(parse_size(args.cap))
    rows = []
    measured_before = {}
    for path in args.table_from or []:
        measured_before.update({r["name"]: r for r in json.loads(Path(path).read_text())["rows"]})
    for name, shape, overrides, mode in CONFIGS:
        if args.table_from is not None:
            if name not in measured_before:
                continue
            length = next(o.split("=")[1] for o in overrides if o.startswith("rollout.max_completion_length"))
            cfg_path = (BENCH_DIR / "calibration" / name).with_suffix(".yaml")
            r = dict(measured_before[name])
            r["predicted_mib"] = predict(cfg_path, overrides + [f"rollout.min_completion_length={length}"],
                                         mode) / 2**20
            r["ratio"] = r["predicted_mib"] / r["measured_mib"] if r["measured_mib"] else float("nan")
            rows.append(r)
            continue
        if args.only and name not in args.only:
            continue
        model_dir = build_model_folder(shape)
        run_dir = BENCH_DIR / "calibration" / name
        cfg_path = run_dir.with_suffix(".yaml")
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(yaml.safe_dump(base_config(model_dir, prompts, run_dir, args.steps)))
        length = next(o.split("=")[1] for o in overrides if o.startswith("rollout.max_completion_length"))
        overrides = overrides + [f"rollout.min_completion_length={length}"]
        predicted = predict(cfg_path, overrides, mode)
        t0 = time.perf_counter()
        if mode == "train":
            cmd, env = [sys.executable, "-m", "slimgrpo", "train", str(cfg_path), *overrides], None
        else:
            cmd, env = child_command("update_only", cfg_path, *overrides), child_env()
        outcome = run_measured(cmd, run_dir.with_suffix(".log"), cap, f"calib-{name}", env=env,
                               timeout_s=args.timeout)
        measured = (outcome.peak_rss_mib or 0) * 2**20
        ratio = predicted / measured if measured else float("nan")
        rows.append({"name": name, "mode": mode, "layers": shape["layers"], "predicted_mib": predicted / 2**20, "measured_mib": measured / 2**20,
                     "ratio": ratio, "ok": outcome.returncode == 0, "error": outcome.error,
                     "wall_s": time.perf_counter() - t0})
        print(f"{name:22s} predicted {predicted / 2**20:8.0f} MiB  measured {measured / 2**20:8.0f} MiB  "
              f"ratio {ratio:5.2f}  {'ok' if outcome.returncode == 0 else outcome.error}", file=sys.stderr, flush=True)
        if args.out:  # after every configuration, so an interrupted sweep keeps what it measured
            Path(args.out).write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))

    print("\n| configuration | mode | layers | predicted MiB | measured peak RSS MiB | predicted / measured | within ±15% |")
    print("|---|---|---:|---:|---:|---:|:---:|")
    for r in rows:
        within = "yes" if abs(r["ratio"] - 1) <= 0.15 else "no"
        print(f"| {r['name']} | {r['mode']} | {r['layers']} | {r['predicted_mib']:,.0f} | {r['measured_mib']:,.0f} | "
              f"{r['ratio']:.2f} | "
              f"{within if r['ok'] else 'run failed: ' + r['error']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
