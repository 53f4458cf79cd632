"""vLLM against slimgrpo's own engine, side by side in one run (issue 45; docs/rollout.md#which-engine).

    python -m benchmarks.rollout.vs_vllm --python /work/vllm-env/bin/python --model .bench/models/smollm2
    python -m benchmarks.rollout.vs_vllm --python /work/vllm-env/bin/python --model .bench/models/smollm2 --quick

Both engines run under the same interpreter (``--python``: an environment with vLLM, see docs/rollout.md: vLLM
pins transformers < 5.20, and slimgrpo's engine runs there too, so the two share every library), each run in a
process of its own (``benchmarks.children.rollout_engine``, or ``slimgrpo demo``), **alternating** (slimgrpo, vllm, slimgrpo, vllm, ...) so that drift in a shared machine's
load hits both alike. Measured per run, from outside the process: peak RSS (harness/measure.py);
from inside: start-up (process start to engine ready), tokens/s, and for whole steps the step time, the
generation time and the weight sync (``rollout/weight_sync_s``).

Cases (W-real: SmolLM2-135M-Instruct, 2 GSM8K chat prompts x 8 completions of at most 128 tokens, T=1):
``decode-fp32``, ``decode-bf16`` (each engine in bfloat16, pinned to 128 tokens and stopping at EOS),
``step-full`` / ``step-lora`` (3 GRPO steps, medians of steps 2-3), ``demo`` (``slimgrpo demo`` with each engine,
both on the demo model's vLLM twin ``model_h32``, 2 heads of 32: the demo's own model has head size 16, which
vLLM-CPU does not take; ``--demo-model`` names another).

Timings need a quiet machine: the table says the load average at the start and end of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.harness.builders import write_chat_prompts
from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap
from benchmarks.harness.paths import BENCH_DIR
from benchmarks.harness.processes import child_command, child_env

ENGINES = ("slimgrpo", "vllm")
CASES = ("decode-fp32", "decode-bf16", "step-full", "step-lora", "demo")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="interpreter of an environment with vLLM installed")
    p.add_argument("--model", default=str(BENCH_DIR / "models" / "smollm2"),
                   help="SmolLM2-135M-Instruct folder (python scripts/get_smollm2.py DIR)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--repeats", type=int, default=3, help="runs per engine and case, alternating")
    p.add_argument("--num-threads", type=int, default=2)
    from benchmarks.surface import DEMO_VLLM_MODEL_DIR

    p.add_argument("--demo-model", default=str(DEMO_VLLM_MODEL_DIR),
                   help="model folder of the demo case, for both engines (head size >= 32 for vLLM-CPU)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, 16 tokens, 2 steps, one call")
    p.add_argument("--out", default=str(BENCH_DIR / "runs" / "bench_vllm"))
    p.add_argument("--table-from", metavar="ROWS_JSON",
                   help="run nothing: print the table of an earlier run's rows.json")
    return p.parse_args(argv)


def spec_for(case: str, engine: str, a: argparse.Namespace, out: Path, prompts: Path) -> dict:
    mode, variant = case.split("-")
    spec = {"mode": mode, "engine": engine, "model_path": a.model, "prompts_path": str(prompts), "prompts": 2,
            "generations": 8, "completion_length": 16 if a.quick else 128, "num_threads": a.num_threads,
            "dtype": "bfloat16" if variant == "bf16" else "float32", "calls": 1 if a.quick else 2,
            "steps": 2 if a.quick else 3, "lora": variant == "lora", "output_dir": str(out / "run")}
    return spec


def one_run(case: str, engine: str, repeat: int, a: argparse.Namespace, prompts: Path, cap) -> list[dict]:
    """The records of one run (several for decode: pinned and EOS), each with its peak RSS and the load."""
    out = Path(a.out) / f"{case}-{engine}-{repeat}"
    out.mkdir(parents=True, exist_ok=True)
    # the vLLM environment sees the checkout (root and src/) and nothing of this one's PYTHONPATH
    env = child_env(inherit_pythonpath=False, CUDA_VISIBLE_DEVICES="")
    load0 = os.getloadavg()[0]
    rows = []
    if case == "demo":
        args = ["-m", "slimgrpo", "demo", f"rollout.engine={engine}", "--output-dir", str(out / "demo")]
        if a.demo_model:
            args.append(f"model.path={a.demo_model}")
        if a.quick:
            args.append("run.max_steps=2")
        res = run_measured([a.python, *args], out / "log.txt", cap, f"vllm-{case}-{engine}", env=env,
                           timeout_s=3600)
        summary = out / "demo" / "summary.json"
        s = json.loads(summary.read_text()) if summary.is_file() else {}
        rows.append({"wall_s": res.wall_s, "gain": (s["eval_after"] - s["eval_before"]) if s else None,
                     "error": res.error, "peak_rss_mib": res.peak_rss_mib})
    else:
        for pin in ((True, False) if case.startswith("decode") else (False,)):
            spec = spec_for(case, engine, a, out, prompts) | {"pin": pin}
            path = out / f"spec-{int(pin)}.json"
            path.write_text(json.dumps(spec))
            res = run_measured(child_command("rollout_engine", path, python=a.python), out / f"log-{int(pin)}.txt",
                               cap, f"vllm-{case}-{engine}", env=env, timeout_s=3600)
            start = next((r["start_s"] for r in res.records if r["kind"] == "start"), None)
            work = [r for r in res.records if r["kind"] in ("decode", "step")]
            if case.startswith("step"):
                work = work[1:] or work  # medians of steps 2.. (the first warms up)
            rows.append({"pin": pin, "start_s": start, "peak_rss_mib": res.peak_rss_mib, "error": res.error,
                         "tokens_per_s": _med([r["tokens_per_s"] for r in work]),
                         "step_s": _med([r.get("step_s") for r in work]),
                         "sync_s": _med([r.get("sync_s") for r in work]),
                         "logprob_diff_max": _med([r.get("logprob_diff_max") for r in work])})
    for r in rows:
        r.update(case=case, engine=engine, repeat=repeat, load_start=load0, load_end=os.getloadavg()[0])
        print(json.dumps(r), flush=True)
    return rows


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(rows: list[dict]) -> str:
    """Medians per case and engine, with the load average seen around those runs (min - max)."""
    keys = ("start_s", "tokens_per_s", "step_s", "sync_s", "peak_rss_mib", "gain", "wall_s")
    out = ["| case | engine | runs | " + " | ".join(keys) + " | sync / step | load | errors |",
           "|---|---|---:|" + "---:|" * (len(keys) + 1) + "---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        label = r["case"] + ("" if "pin" not in r else (" pinned" if r["pin"] else " EOS"))
        groups.setdefault((label, r["engine"]), []).append(r)
    for (label, engine), rs in groups.items():
        vals = [_med([r.get(k) for r in rs]) for k in keys]
        share = vals[3] / vals[2] if vals[2] and vals[3] is not None else None
        cells = ["-" if v is None else f"{v:,.2f}" for v in vals] + ["-" if share is None else f"{share:.1%}"]
        loads = [x for r in rs for x in (r.get("load_start"), r.get("load_end")) if x is not None]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
        errors = "; ".join(sorted({r["error"] for r in rs if r.get("error")}))[:120]
        out.append(f"| {label} | {engine} | {len(rs)} | " + " | ".join(cells) + f" | {load} | {errors} |")
    return "\n".join(out)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.table_from:
        print(table(json.loads(Path(a.table_from).read_text())))
        return 0
    if a.quick:
        a.repeats = 1
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"no model at {a.model}: python scripts/get_smollm2.py {a.model}")
    prompts = write_chat_prompts(BENCH_DIR / "prompts" / "gsm8k_test_chat_2.jsonl", 2)
    cap = choose_memory_cap(None)
    rows = []
    for case in a.cases:
        for repeat in range(a.repeats):
            order = ENGINES if repeat % 2 == 0 else ENGINES[::-1]  # alternate who goes first
            for engine in order:
                rows += one_run(case, engine, repeat, a, prompts, cap)
    text = table(rows)
    print(text)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "table.md").write_text(text + "\n")
    (Path(a.out) / "rows.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
