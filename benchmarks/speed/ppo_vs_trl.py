"""slimgrpo's PPO against TRL's last PPOTrainer (issue 24's memory anchor): peak RSS and s/step.

    python -m benchmarks.speed.ppo_vs_trl --trl-path /tmp/trl112 [--layers 2] [--steps 3] [--length 64] [--cap 12GiB]

TRL 1.16 has no PPO trainer; the newest release with one is TRL 1.12.0 (``trl.experimental.ppo``). Install it
apart from the project's environment, e.g. ``pip install --no-deps --target /tmp/trl112 trl==1.12.0`` (its
requirements, transformers / accelerate / datasets, are the project's), and pass that folder as ``--trl-path``:
only TRL's child process sees it.

The workload: a random-init model of the Qwen2.5-0.5B widths and vocabulary (151,936) with ``--layers``
decoder layers (24 = the real depth), fp32, CPU; 4 prompts a step, one completion each, ``--length`` tokens
(slimgrpo pinned with min_completion_length; TRL's random policy almost never samples EOS in 152K tokens), one
PPO epoch over one mini-batch, kl_coef 0.05. TRL holds its four models (policy, reference, reward model and
value model, each a model of this shape; policy and value with AdamW); slimgrpo's reward is a function (no
reward model), its LoRA PPO keeps one base with two adapters, its full PPO a policy, a critic and a reference.
Runs: ``trl`` (full fine-tuning, TRL's way), ``ppo-lora``, ``ppo-full``, ``grpo-lora`` (4 prompts x 4
completions); each in its own process (``benchmarks.children.ppo_run``) under a memory cap, peak RSS from outside,
the plan next to slimgrpo's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.children.ppo_run import PROMPTS_PER_STEP, slimgrpo_config
from benchmarks.harness import processes
from benchmarks.harness.builders import build_model_folder, load_shape, write_prompts
from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap, parse_size
from benchmarks.harness.paths import BENCH_DIR


def _spec(a, model: str, prompts: str, out: Path) -> dict:
    return {"model": model, "prompts": prompts, "steps": a.steps, "length": a.length, "out": str(out),
            "threads": a.threads}


def plan_gib(spec: dict) -> float:
    """slimgrpo's plan of the run (the one ``slimgrpo train`` prints before it starts)."""
    from benchmarks.surface import plan_memory, run_spec, shape_of

    cfg = slimgrpo_config(spec)
    shape = shape_of(cfg)
    return plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab)).peak_bytes / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-path", help="folder holding TRL 1.12 (pip install --no-deps --target DIR trl==1.12.0)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Qwen2.5-0.5B-wide model (24 = real)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--length", type=int, default=64, help="completion tokens")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cap", default="12GiB", help="memory cap per run")
    p.add_argument("--runs", default="trl,ppo-lora,ppo-full,grpo-lora")
    a = p.parse_args()
    shape = dict(load_shape("qwen2.5-0.5b"), layers=a.layers)
    model = str(build_model_folder(shape, dtype="float32"))
    prompts = str(write_prompts(BENCH_DIR / "prompts" / "ppo_prompts.jsonl", PROMPTS_PER_STEP * a.steps))
    cap = choose_memory_cap(parse_size(a.cap))
    root = BENCH_DIR / "ppo_vs_trl" / time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for mode in a.runs.split(","):
        out = root / mode
        out.mkdir(parents=True, exist_ok=True)
        spec = dict(_spec(a, model, prompts, out / "run"), mode=mode)
        (out / "spec.json").write_text(json.dumps(spec))
        if mode == "trl" and not a.trl_path:
            sys.exit("--trl-path is needed for the trl run")
        env = processes.child_env(*([a.trl_path] if mode == "trl" else []))  # TRL 1.12 seen by its child only
        cmd = processes.child_command("ppo_run", "trl" if mode == "trl" else "slimgrpo", out / "spec.json")
        res = run_measured(cmd, out / "log.txt", cap, f"ppo-{mode}", env=env, timeout_s=1800)
        end = next((r for r in res.records if r.get("event") == "end"), {})
        steps = end.get("step_s") or []
        warm = steps[1:] or steps
        row = {"run": mode, "trainer": end.get("trainer"), "ok": res.returncode == 0,
               "peak_rss_mib": res.peak_rss_mib, "s_per_step": sorted(warm)[len(warm) // 2] if warm else None,
               "plan_gib": None if mode == "trl" else round(plan_gib(spec), 2),
               "error": res.error}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (root / "results.json").write_text(json.dumps(rows, indent=2))
    print("\n| run | peak RSS (MiB) | plan (MiB) | s/step | vs TRL peak |\n|---|---:|---:|---:|---:|")
    trl_peak = next((r["peak_rss_mib"] for r in rows if r["run"] == "trl" and r["ok"]), None)
    for r in rows:
        ratio = f"{r['peak_rss_mib'] / trl_peak:.2f}x" if trl_peak and r["peak_rss_mib"] and r["ok"] else ""
        plan = f"{r['plan_gib'] * 1024:,.0f}" if r["plan_gib"] else ""
        peak = f"{r['peak_rss_mib']:,.0f}" if r["peak_rss_mib"] else "?"
        sps = f"{r['s_per_step']:.1f}" if r["s_per_step"] else ("failed: " + r["error"][:60] if not r["ok"] else "")
        print(f"| {r['run']} | {peak} | {plan} | {sps} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
