"""The plan against the measured peak (issue 43 item 3): one table, each CPU-feasible row of the planner's matrix at
real sizes, peak RSS measured from outside the process (speed/vs_trl.py's runner: a fresh intermediate reads the child's
ru_maxrss), beside ``slimgrpo plan``'s peak and, with ``--trace``, the trace's device peak of the run's own config.

    python -m benchmarks.planner.plan_vs_measured [--rows w-long-8x8k,demo,...] [--trace] [--out FILE.json]
    python -m benchmarks.planner.plan_vs_measured --plan-only          # the plan column only (seconds; no runs)

Rows (``ROWS``): W-long 8 x 8K on W-cpu's shape (full fine-tuning, fp32, no checkpointing; the tiled MLP by
``auto``), SmolLM2-135M's 8K window both ways (benchmarks/planner/window.py's settings: checkpointing, 2 x (256 + 7,936)
and 2 x (7,000 + 1,024)), W-real full and LoRA (SmolLM2 on GSM8K, completions to EOS; the ``-pinned`` rows generate
every completion at its full 128 tokens, as the plan counts them), the addition recipe
(examples/smollm2_addition.yaml) and the demo. The plan and the trace count prompts at the longest of the run's
data (tokenized as the run reads them: train/prompts.py), as `slimgrpo train` plans them.
SmolLM2 rows need
``python scripts/get_smollm2.py .bench/smollm2``; rows whose inputs are missing print why and are skipped.
The goal: plan / measured and trace / measured within 0.9 - 1.1 on every row, and where a row must err, the plan
above the measurement (the safe side). Peak RSS is a memory figure: fine on a busy machine (the load is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.harness.machine import machine_info, machine_line
from benchmarks.harness.memcap import choose_memory_cap
from benchmarks.harness.paths import BENCH_DIR, REPO_ROOT
from benchmarks.harness.tables import MIB, format_mib
from benchmarks.speed import vs_trl


@dataclass
class Row:
    what: str
    settings: Callable[[], "vs_trl.Settings | None"]  # None: inputs missing (printed by the builder)


def _vs_trl(*args: str) -> Callable[[], "vs_trl.Settings"]:
    def build():
        s = vs_trl.workload_settings(vs_trl.parse_args(list(args)))
        vs_trl.prepare_inputs(s)
        return s
    return build


def _window(variant: str) -> Callable[[], "vs_trl.Settings | None"]:
    def build():
        from benchmarks.planner import window

        if not (BENCH_DIR / "smollm2" / "config.json").is_file():
            return _missing("SmolLM2-135M-Instruct: python scripts/get_smollm2.py .bench/smollm2")
        return window.settings(variant, None, 2)
    return build


def _pinned(build: Callable[[], "vs_trl.Settings | None"]) -> Callable[[], "vs_trl.Settings | None"]:
    """The same row with every completion at its full length (min = max new tokens), as the plan counts them (the
    W-real rows stop at EOS, far under 128 tokens on average). Measured: the peak does not move; the plan's excess
    there was its prompts counted at data.max_prompt_length, before it read the data
    (docs/benchmarks.md#plan-vs-measured)."""
    def build_pinned():
        s = build()
        if s is not None:
            s.pin_length = True
        return s
    return build_pinned


def _needs_smollm2(build: Callable[[], "vs_trl.Settings"]) -> Callable[[], "vs_trl.Settings | None"]:
    def guarded():
        if not (BENCH_DIR / "smollm2" / "config.json").is_file():
            return _missing("SmolLM2-135M-Instruct: python scripts/get_smollm2.py .bench/smollm2")
        return build()
    return guarded


def _addition() -> "vs_trl.Settings | None":
    """examples/smollm2_addition.yaml's settings through vs_trl's slimgrpo child (its prompts, reward and sizes
    as the recipe sets them; two steps)."""
    import yaml

    if not (BENCH_DIR / "smollm2" / "config.json").is_file():
        return _missing("SmolLM2-135M-Instruct: python scripts/get_smollm2.py .bench/smollm2")
    recipe = yaml.safe_load((REPO_ROOT / "examples" / "smollm2_addition.yaml").read_text())
    s = vs_trl.workload_settings(vs_trl.parse_args(["--workload", "w-real"]))
    s.workload = "addition"
    s.num_generations = recipe["rollout"]["num_generations"]
    s.prompts_per_step = recipe["run"]["batch_size"] // s.num_generations
    s.completion_length = recipe["rollout"]["max_completion_length"]
    s.max_prompt_length = recipe["data"].get("max_prompt_length", s.max_prompt_length)
    s.lora = bool(recipe.get("lora", {}).get("enabled", False))
    s.gradient_checkpointing = bool(recipe.get("memory", {}).get("gradient_checkpointing", False))
    s.steps = 2
    vs_trl.prepare_inputs(s)
    return s


def _missing(why: str) -> None:
    print(f"    skipped: needs {why}", file=sys.stderr)
    return None


ROWS: dict[str, Row] = {
    "w-long-8x8k": Row("W-long 8 x (512 + 8,192), W-cpu shape, full, fp32",
                       _vs_trl("--workload", "w-cpu", "--generations", "8", "--completion-length", "8192",
                               "--steps", "2", "--repeats", "1")),
    "smollm2-window-long-completion": Row("SmolLM2 8K window, 2 x (256 + 7,936), full, checkpointing",
                                          _window("long-completion")),
    "smollm2-window-long-prompt": Row("SmolLM2 8K window, 2 x (7,000 + 1,024), full, checkpointing",
                                      _window("long-prompt")),
    "w-real-full": Row("W-real: SmolLM2 on GSM8K, 16 x 128 to EOS, full",
                       _needs_smollm2(_vs_trl("--workload", "w-real", "--steps", "2"))),
    "w-real-lora": Row("W-real: SmolLM2 on GSM8K, 16 x 128 to EOS, LoRA",
                       _needs_smollm2(_vs_trl("--workload", "w-real", "--lora", "--steps", "2"))),
    "w-real-full-pinned": Row("W-real, full, every completion 128 tokens (pinned)",
                              _pinned(_needs_smollm2(_vs_trl("--workload", "w-real", "--steps", "2")))),
    "w-real-lora-pinned": Row("W-real, LoRA, every completion 128 tokens (pinned)",
                              _pinned(_needs_smollm2(_vs_trl("--workload", "w-real", "--lora", "--steps", "2")))),
    "addition": Row("addition recipe (examples/smollm2_addition.yaml), 2 steps", _addition),
    "demo": Row("demo (slimgrpo demo's model and task)", _vs_trl("--workload", "demo", "--steps", "3")),
}


def plan_of(config: Path, trace: bool) -> tuple[float, float | None, str]:
    """(plan peak MiB, trace device peak MiB or None, the plan's tricks) of a run's own config.yaml."""
    from benchmarks.surface import assumed_tricks, data_prompt_tokens, load_config, plan_memory, run_spec, shape_of

    cfg = load_config(str(config), [], validate=False)
    shape = shape_of(cfg)
    longest = data_prompt_tokens(cfg)  # as `slimgrpo train` plans: prompts at the data's longest
    plan = plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab, prompt_tokens=longest))
    traced = None
    if trace:
        from benchmarks.surface import trace_config

        traced = trace_config(cfg, shape, "cpu", prompt_tokens=longest).device_peak_bytes / MIB
    tricks = "; ".join(t.split(" (")[0] for t in assumed_tricks(plan) if t.startswith(("tiled", "gradient", "update")))
    return plan.peak_bytes / MIB, traced, tricks


def plan_only(s: "vs_trl.Settings", folder: Path) -> Path:
    """The config slimgrpo's child would write for ``s`` (no run): for ``--plan-only``."""
    import yaml

    from benchmarks.children.slimgrpo_grpo import config_dict

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config_dict(s.spec("slimgrpo", folder / "output", s.completion_length))))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    p.add_argument("--trace", action="store_true", help="also trace each run's config (minutes at W-long's size)")
    p.add_argument("--plan-only", action="store_true", help="no runs: the plan of each row's config")
    p.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    p.add_argument("--out", help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    names = [r.strip() for r in a.rows.split(",") if r.strip()]
    for n in names:
        if n not in ROWS:
            sys.exit(f"unknown row {n!r} ({', '.join(ROWS)})")
    info = machine_info()
    cap = choose_memory_cap(None, "auto")
    root = BENCH_DIR / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-plan-vs-measured"
    rows = []
    for n in names:
        print(f"[{time.strftime('%H:%M:%S')}] {n}: {ROWS[n].what}", file=sys.stderr)
        s = ROWS[n].settings()
        if s is None:
            rows.append({"row": n, "what": ROWS[n].what, "error": "inputs missing"})
            continue
        measured, error = None, ""
        if a.plan_only:
            config = plan_only(s, root / n)
        else:
            r = vs_trl.run_one("slimgrpo", 1, s, root / n, cap, s.completion_length, a.timeout)
            measured = r.outcome.peak_rss_mib if r.ok else None
            error = "" if r.ok else r.outcome.error
            config = root / n / f"slimgrpo-L{s.completion_length}-r1" / "output" / "config.yaml"
        plan, traced, tricks = plan_of(config, a.trace)
        rows.append({"row": n, "what": ROWS[n].what, "measured_mib": measured, "plan_mib": plan, "trace_mib": traced,
                     "tricks": tricks, "error": error, "load_avg_1m": machine_info().get("load_avg_1m")})
    print(f"\n{machine_line(info)}; load {info.get('load_avg_1m')} "
          "at start (peak RSS is a memory figure: the load does not change it)")
    print("| row | peak RSS MiB (measured) | plan MiB | plan / measured | trace MiB | trace / measured | tricks (plan) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        m, pl, tr = r.get("measured_mib"), r.get("plan_mib"), r.get("trace_mib")
        cell = format_mib(m) if m else (r.get("error") or "-")
        print(f"| {r['what']} | {cell} | {f'{pl:,.0f}' if pl else '-'} | {f'{pl / m:.2f}' if pl and m else '-'} | "
              f"{f'{tr:,.0f}' if tr else '-'} | {f'{tr / m:.2f}' if tr and m else '-'} | {r.get('tricks', '')} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": info, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
