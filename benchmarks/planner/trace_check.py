"""The trace against reality: every CPU calibration row, traced on fake tensors, against its measured peak RSS.

    python -m benchmarks.planner.trace_check                   # the 19 calibration rows and the 6 W-long lengths
    python -m benchmarks.planner.trace_check --only qwen05x2-full-256 wcpu-full-256

For each configuration of ``calibrate_memory.py`` that docs/benchmarks.md reports a measured peak RSS
for, build the same config (the same overrides, completion length pinned), trace one step with
``slimgrpo.plan.admission.trace_config`` (update mode: the update alone, as ``children/update_only.py`` runs
it; train mode: generation and update) and print:

* trace + runtime: the traced tensor peak plus ``memory.footprint.cpu_runtime_bytes`` (the Python / torch runtime
  and the tokenizer, which the planner adds on CPU), against the measured peak RSS;
* plan: the planner's prediction for the same mode, against the trace + runtime.

Nothing is measured here (no model is run for real); the measured column is copied from the
calibration table, whose commands are in docs/benchmarks.md. Goal (issue 23): both ratios within ±10%.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.planner.calibrate_memory import CONFIGS

# Measured peak RSS (MiB) of each configuration: docs/benchmarks.md#calibration (session 3, quiet
# machine, glibc fix in place), the 15 rows of the main table and the 4 held-out rows.
MEASURED_MIB = {
    "wcpu-full-256": 921, "wcpu-lora-beta": 665, "deep-lora-ckpt-512": 1034, "qwen05x2-full-256": 4035,
    "qwen05x2-lora-4k": 2976, "qwen05x2-full-ckpt-4k": 4124, "llama1bx2-lora-ckpt-4k": 4017,
    "qwen05x2-full-micro1-2k": 4467, "qwen05x2-full-tokens2k-2k": 4467, "llama1bx2-lora-2k": 3107,
    "qwen05x2-lora-ckpt-8k": 3402, "llama1bx2-lora-ckpt-tokens-8k": 4021, "qwen05x2-lora-eager-1k": 1652,
    "qwen05x1-lora-ckpt-16k": 5532, "qwen05x2-shared8-2k": 4558,
    "wcpu-full-1024": 1061, "wcpu-full-beta": 999, "deep-full-ckpt-512": 1496, "deep-full-micro2-512": 2106,
}


# W-long (docs/benchmarks.md#w-long): slimgrpo's measured peak RSS per completion length; W-cpu shape, 1 prompt
# (at most 128 tokens) x 2 completions, checkpointing, beta 0.04, full fine-tuning, 2 steps with decoding.
W_LONG_MIB = {512: 986, 1024: 988, 2048: 986, 4096: 992, 8192: 1123, 16384: 1417}
for _length, _mib in W_LONG_MIB.items():
    MEASURED_MIB[f"w-long-{_length}"] = _mib
    CONFIGS.append((f"w-long-{_length}", {**CONFIGS[0][1], "max_positions": 32768},
                    ["rollout.num_generations=2", "run.batch_size=2", "memory.gradient_checkpointing=true",
                     "loss.beta=0.04", f"rollout.max_completion_length={_length}"], "train"))


def row_config(overrides: list[str]):
    """The calibration run's config (``calibrate_memory.base_config``'s settings that matter for memory)."""
    from benchmarks.surface import from_dict, merge_overrides

    length = next(o.split("=")[1] for o in overrides if o.startswith("rollout.max_completion_length"))
    base = {"model": {"dtype": "float32"}, "data": {"max_prompt_length": 128}, "rollout": {"num_generations": 8},
            "run": {"batch_size": 8, "device": "cpu"}}
    return from_dict(merge_overrides(base, [*overrides, f"rollout.min_completion_length={length}"]))


def check(name: str, shape_dict: dict, overrides: list[str], mode: str) -> dict:
    from benchmarks.surface import ModelShape, cpu_runtime_bytes, plan_memory, run_spec, trace_config

    shape = ModelShape(**shape_dict)
    cfg = row_config(overrides)
    plan = plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab))
    planned = plan.peak_bytes if mode == "train" else plan.phase_total("always") + plan.phase_total("update")
    t0 = time.perf_counter()
    trace = trace_config(cfg, shape, device="cpu", generation=mode == "train")
    traced = trace.peak_bytes + cpu_runtime_bytes(shape.vocab)  # the imports and the tokenizer
    return {"name": name, "mode": mode, "layers": shape.layers, "measured": MEASURED_MIB[name] * 2**20,
            "traced": traced, "planned": planned, "phase": trace.peak_phase, "seconds": time.perf_counter() - t0,
            "by_tag": trace.phases[trace.peak_phase].by_tag,
            "phases": {k: v.peak_bytes for k, v in trace.phases.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="check only these configuration names")
    ap.add_argument("--tags", action="store_true", help="also print the trace's breakdown at its peak")
    args = ap.parse_args()
    rows = []
    for name, shape, overrides, mode in CONFIGS:
        if name not in MEASURED_MIB or (args.only and name not in args.only):
            continue
        r = check(name, shape, overrides, mode)
        rows.append(r)
        print(f"{name:30s} traced {r['traced'] / 2**20:8,.0f}  measured {r['measured'] / 2**20:8,.0f}  "
              f"plan {r['planned'] / 2**20:8,.0f} MiB  ({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
        if args.tags:
            print("   phase peaks " + ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in r["phases"].items()) + "; at the peak: "
                  + ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in r["by_tag"].items() if v), file=sys.stderr)
    M = 2**20
    print("\n| configuration | mode | layers | measured peak RSS MiB | trace + runtime MiB | trace / measured "
          "| plan MiB | plan / trace | both within ±10% |")
    print("|---|---|---:|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        a, b = r["traced"] / r["measured"], r["planned"] / r["traced"]
        ok = "yes" if abs(a - 1) <= 0.10 and abs(b - 1) <= 0.10 else "no"
        print(f"| {r['name']} | {r['mode']} | {r['layers']} | {r['measured'] / M:,.0f} | {r['traced'] / M:,.0f} | "
              f"{a:.2f} | {r['planned'] / M:,.0f} | {b:.2f} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
