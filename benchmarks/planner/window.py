"""A real model's whole context window: SmolLM2-135M-Instruct at 8,192 tokens, slimgrpo against TRL 1.16
(issue 29), peak RSS measured from outside each process, and slimgrpo's trace of the same config.

    python -m benchmarks.planner.window [--model .bench/smollm2] [--variants long-completion,long-prompt]
                                        [--trainers trl,slimgrpo] [--steps 2] [--timeout 3600] [--out FILE.json]

Both trainers get the same folder, prompts, reward and settings (speed/vs_trl.py's children): 1 prompt x 2
completions, full fine-tuning, fp32 on CPU, gradient checkpointing on in both, completions pinned (minimum
= maximum new tokens), so both fill the window:

- ``long-completion``: a GSM8K chat prompt (at most 256 tokens) + 7,936 generated tokens;
- ``long-prompt``: one chat prompt of about 7,000 tokens (GSM8K questions, one after another, with the
  reasoning system prompt) + 1,024 generated tokens.

Each run is two optimizer steps (``--steps``): memory, not speed, is the figure here, and AdamW creates its
state at the first ``optimizer.step()``, so only from the second step on does backward run beside it (the
steady state that the trace models; a one-step run peaks lower by the state, 2 x the trainable weights). After the runs,
``slimgrpo plan --trace --device cpu`` traces slimgrpo's config of each variant; its "device peak from
the trace" (traced tensors + the measured CPU runtime) is printed beside the measured peak.
Goals (issue 29): slimgrpo's peak RSS <= 1/3 of TRL's, the trace within +-10% of slimgrpo's peak.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.children.slimgrpo_grpo import config_dict
from benchmarks.harness.builders import REASONING_SYSTEM_PROMPT, gsm8k_test
from benchmarks.harness.machine import machine_info, machine_line
from benchmarks.harness.memcap import choose_memory_cap, parse_size
from benchmarks.harness.paths import BENCH_DIR
from benchmarks.harness.tables import format_mib
from benchmarks.speed import vs_trl

WINDOW = 8192
VARIANTS = {  # name: (max prompt tokens, completion tokens)
    "long-completion": (256, WINDOW - 256),
    "long-prompt": (7168, 1024),
}
LONG_PROMPT_TOKENS = 7000


def long_prompt_file(model: Path, path: Path, target: int = LONG_PROMPT_TOKENS) -> Path:
    """One conversational prompt of about ``target`` tokens (by the model's chat template): GSM8K test
    questions, numbered, after the reasoning system prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    questions = [q for q, _ in gsm8k_test(400)]
    head = "Solve every problem below. Give only the answer to the last one.\n\n"
    body, n = "", 0
    for i, q in enumerate(questions, 1):
        candidate = body + f"Problem {i}: {q}\n\n"
        messages = [{"role": "system", "content": REASONING_SYSTEM_PROMPT},
                    {"role": "user", "content": head + candidate}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        length = len(tok(text, add_special_tokens=False)["input_ids"])  # (tokenize=True gives a dict in 5.x)
        if length > target:
            break
        body, n = candidate, length
    row = {"prompt": [{"role": "system", "content": REASONING_SYSTEM_PROMPT},
                      {"role": "user", "content": head + body}], "answer": "0"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for _ in range(8)) + "\n")
    print(f"long prompt: {n:,} tokens ({path})", file=sys.stderr)
    return path


def settings(variant: str, model: str | None, steps: int) -> vs_trl.Settings:
    s = vs_trl.Settings(workload=f"window-{variant}")
    vs_trl._real_settings(s, model)  # SmolLM2 folder, shape, chat prompts
    prompt, completion = VARIANTS[variant]
    s.num_generations, s.prompts_per_step, s.steps = 2, 1, steps
    s.max_prompt_length, s.completion_length = prompt, completion
    s.pin_length, s.gradient_checkpointing, s.lora = True, True, False
    if variant == "long-prompt":
        s.prompts_path = str(long_prompt_file(Path(s.model_path), BENCH_DIR / "prompts" / "window_long.jsonl"))
    vs_trl.prepare_inputs(s)
    return s


def traced_peak_mib(s: vs_trl.Settings, folder: Path) -> tuple[float | None, float | None, str]:
    """slimgrpo plan --trace on slimgrpo's config of ``s``: (trace device peak, plan peak) in MiB, and the log."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    cfg = config_dict(s.spec("slimgrpo", folder / "output", s.completion_length))
    config = folder / "trace.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "slimgrpo", "plan", str(config), "--trace", "--device", "cpu"],
                         capture_output=True, text=True, env=vs_trl.child_env(), timeout=3600)
    text = out.stdout + out.stderr
    (folder / "trace.log").write_text(text)
    flat = " ".join(text.split())
    m = re.search(r"device peak from the trace: ([\d.,]+) GiB .*?; plan ([\d.,]+) GiB", flat)
    if not m:
        return None, None, text
    return (float(m.group(1).replace(",", "")) * 1024, float(m.group(2).replace(",", "")) * 1024, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the SmolLM2-135M-Instruct folder (default .bench/smollm2)")
    p.add_argument("--variants", default="long-completion,long-prompt")
    p.add_argument("--trainers", default="trl,slimgrpo")
    p.add_argument("--steps", type=int, default=2,
                   help="optimizer steps per run (from the second on, the AdamW state is live during backward: the "
                        "steady state the trace models; one step peaks lower by that state)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--mem-cap", help="memory cap per run, e.g. 20GiB (default: none)")
    p.add_argument("--out", help="also write the records to this JSON file")
    a = p.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    trainers = [t.strip() for t in a.trainers.split(",") if t.strip()]
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"unknown variant {v!r} ({', '.join(VARIANTS)})")
    cap = choose_memory_cap(parse_size(a.mem_cap) if a.mem_cap else None, "auto")
    info = machine_info()
    root = BENCH_DIR / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-window"
    rows = []
    for v in variants:
        s = settings(v, a.model, a.steps)
        print(vs_trl.machine_header(info, s, cap), file=sys.stderr)
        peaks = {}
        for t in trainers:
            r = vs_trl.run_one(t, 1, s, root / v, cap, s.completion_length, a.timeout)
            peaks[t] = (r.outcome.peak_rss_mib if r.ok else None, r.outcome.error, r.outcome.wall_s)
        trace, plan, _ = traced_peak_mib(s, root / v / "trace")
        rows.append({"variant": v, "prompt_max": s.max_prompt_length, "completion": s.completion_length,
                     **{f"{t}_peak_mib": peaks[t][0] for t in trainers},
                     **{f"{t}_error": peaks[t][1] for t in trainers},
                     **{f"{t}_wall_s": peaks[t][2] for t in trainers},
                     "trace_mib": trace, "plan_mib": plan})
    load = info.get("load_avg_1m")
    print(f"\n{machine_line(info)}; load {load} at start")
    print("| variant | TRL peak RSS MiB | slimgrpo peak RSS MiB | slimgrpo / TRL | trace MiB | trace / slimgrpo | "
          "plan MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fmt = format_mib
    for r in rows:
        trl, ours = r.get("trl_peak_mib"), r.get("slimgrpo_peak_mib")
        ratio = f"{ours / trl:.2f}" if trl and ours else "-"
        tr = f"{r['trace_mib'] / ours:.2f}" if r["trace_mib"] and ours else "-"
        print(f"| {r['variant']} (prompt <= {r['prompt_max']:,}, completion {r['completion']:,}) | "
              f"{fmt(trl) if trl else r.get('trl_error') or '-'} | {fmt(ours) if ours else r.get('slimgrpo_error') or '-'}"
              f" | {ratio} | {fmt(r['trace_mib']) if r['trace_mib'] else '-'} | {tr} | "
              f"{fmt(r['plan_mib']) if r['plan_mib'] else '-'} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": info, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
