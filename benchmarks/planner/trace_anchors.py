"""The published GPU anchors' settings, simulated: plan and trace (fake tensors) for CUDA, bf16.

    python -m benchmarks.planner.trace_anchors                  # Oxen's table, Unsloth's 8B x 20K, Qwen3-8B QLoRA
    python -m benchmarks.planner.trace_anchors --only oxen      # or: unsloth, qlora, window, smallest, fit
    python -m benchmarks.planner.trace_anchors --only qlora --tiled-mlp on

Nothing runs on a GPU: each row is ``slimgrpo plan --trace --device cuda`` for the setting, so every
figure is **simulated** until a GPU run confirms it. The device peak from the trace is the traced tensor
peak + the CUDA context (``memory.footprint.CUDA_FRAMEWORK_OVERHEAD_BYTES``) + ``CUDA_TRACE_MARGIN``
(``trace/step.py``) of the traced peak.
Published figures are the brief's (docs/benchmarks.md#anchors-simulated says where each comes from).
"""

from __future__ import annotations

import argparse
import sys
import time

GB, GiB = 1e9, 2**30
OXEN = ["rollout.num_generations=4", "run.batch_size=4", "data.max_prompt_length=256",
        "rollout.max_completion_length=786", "rollout.min_completion_length=786", "loss.beta=0"]
OXEN_VARIANTS = [  # cumulative, as in Oxen's table
    ("full", []),
    ("+ 8-bit AdamW", ["memory.optimizer=adamw_8bit"]),
    ("+ checkpointing", ["memory.optimizer=adamw_8bit", "memory.gradient_checkpointing=true"]),
    ("LoRA", ["memory.optimizer=adamw_8bit", "memory.gradient_checkpointing=true", "lora.enabled=true"]),
]
# Oxen.ai (TRL, one H100, peak VRAM in GB) by the brief; the brief names sizes, not checkpoints
OXEN_PUBLISHED = {"qwen2.5-0.5b": (25, 16, 15, 13), "llama-3.2-1b": (38, 26, 24, 16)}
UNSLOTH = ["lora.enabled=true", "memory.gradient_checkpointing=true", "memory.micro_batch_size=1",
           "rollout.num_generations=8", "run.batch_size=8", "data.max_prompt_length=512",
           "rollout.max_completion_length=19968", "rollout.min_completion_length=19968", "loss.beta=0"]
QLORA = ["lora.enabled=true", "model.load_in_4bit=true", "memory.gradient_checkpointing=true",
         "memory.micro_batch_size=1", "rollout.num_generations=2", "run.batch_size=2", "rollout.max_batch_rows=1",
         "data.max_prompt_length=256", "loss.beta=0"]


def qwen3_8b():
    """Qwen3-8B's shape from its public config.json (not a bundled preset): 36 layers, hidden 4,096, MLP
    12,288, 32 / 8 heads of 128, vocabulary 151,936, untied head; 131,072 positions with YaRN."""
    from benchmarks.surface import ModelShape

    return ModelShape("qwen3", hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, vocab=151_936,
                      tie=False, max_positions=131_072, head_dim=128)


EXTRA: list[str] = []  # --tiled-mlp: appended to every setting


def config(overrides: list[str]):
    from benchmarks.surface import from_dict, merge_overrides

    return from_dict(merge_overrides({}, ["model.dtype=bfloat16", "run.device=cuda", *overrides, *EXTRA]))


def plan_and_trace(model: str, overrides: list[str], trace: bool = True):
    from benchmarks.surface import load_shape, plan_memory, run_spec, trace_config

    shape = qwen3_8b() if model == "qwen3-8b" else load_shape(model)
    cfg = config(overrides)
    plan = plan_memory(shape, run_spec(cfg, "cuda", vocab=shape.vocab))
    return plan, (trace_config(cfg, shape, device="cuda") if trace else None)


def row(setting: str, plan, tr, published: str, seconds: float) -> str:
    return (f"| {setting} | {plan.peak_bytes / GiB:,.1f} | {tr.peak_bytes / GiB:,.1f} | "
            f"{tr.device_peak_bytes / GiB:,.1f} | {tr.peak_phase} | {published} | {seconds:.0f} |")


def longest_fit(model: str, budget: float, base: list[str]) -> tuple[int, list[str]]:
    """Longest completion (multiple of 1,024, or the whole window: the position limit less the prompt) whose
    plan fits ``budget`` bytes, then checked by trace: stepped down 10% at a time until the trace's device
    peak fits too."""
    window = (qwen3_8b().max_positions if model == "qwen3-8b" else 0) - 256  # prompt 256 (QLORA)
    lo, hi = 1024, window if window > 0 else 1 << 22
    full, _ = plan_and_trace(model, base + [f"rollout.max_completion_length={hi}"], trace=False)
    if full.peak_bytes <= budget:
        lo = hi
    while hi - lo > 1024:
        mid = (lo + hi) // 2 // 1024 * 1024
        plan, _ = plan_and_trace(model, base + [f"rollout.max_completion_length={mid}"], trace=False)
        lo, hi = (mid, hi) if plan.peak_bytes <= budget else (lo, mid)
    lines, T = [], lo
    for _ in range(4):
        t0 = time.perf_counter()
        plan, tr = plan_and_trace(model, base + [f"rollout.max_completion_length={T}"])
        fits = tr.device_peak_bytes <= budget
        lines.append(row(f"{model} QLoRA, T = {T:,} ({budget / GB:.0f} GB: {'fits' if fits else 'over'})",
                         plan, tr, "110K tokens on 80 GB (Unsloth)" if budget > 50 * GB else "–",
                         time.perf_counter() - t0))
        print(lines[-1], file=sys.stderr, flush=True)
        if fits:
            return T, lines
        T = int(T * 0.9) // 1024 * 1024
    return 0, lines


HOST_BUDGET = "64GiB"  # --only smallest: host RAM the offload may use (a plausible single-GPU server)


def smallest(model: str, kind: str = "completion-heavy") -> str:
    """The smallest budget that trains ``model`` QLoRA (QLORA's settings) at its whole window, searched by plan
    with memory.fit's changes and the CUDA allocator margin (``plan.longest.smallest_budget``), then
    confirmed by one trace with those changes."""
    from benchmarks.surface import (CUDA_TRACE_MARGIN, load_shape, overrides_for, parse_bytes, run_spec,
                                    smallest_budget, trace_config)

    shape = qwen3_8b() if model == "qwen3-8b" else load_shape(model)
    base = QLORA + ["rollout.max_completion_length=1024", f"memory.host_budget={HOST_BUDGET}"]
    inputs = run_spec(config(base), "cuda", vocab=shape.vocab)
    got = smallest_budget(shape, inputs, kind, host_budget=parse_bytes(HOST_BUDGET), margin=CUDA_TRACE_MARGIN)
    found = got.found
    lengths = [f"data.max_prompt_length={found.prompt}", f"rollout.max_completion_length={found.completion}"]
    changes = overrides_for(found.changes)
    print(f"{model} {kind}: smallest budget {got.budget / GiB:.2f} GiB ({got.budget / GB:.1f} GB), plan "
          f"{found.plan.peak_bytes / GiB:.2f} GiB with {' '.join(changes)}; tracing", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tr = trace_config(config(base + changes + lengths), shape, device="cuda")
    # No rung lowers the peak further, so with these settings the least budget the trace confirms is its own
    # device peak where that is above the plan's budget.
    verdict = ("fits" if tr.device_peak_bytes <= got.budget else
               f"over; by trace {tr.device_peak_bytes / GiB:.2f} GiB = {tr.device_peak_bytes / GB:.1f} GB")
    return row(f"{model} QLoRA {kind}, P {found.prompt:,} + T {found.completion:,} = {found.tokens:,}, smallest "
               f"budget by plan {got.budget / GiB:.2f} GiB = {got.budget / GB:.1f} GB (trace: {verdict}; "
               f"{' '.join(changes)}; host: plan {found.plan.host_bytes / GiB:.1f}, trace "
               f"{tr.host_peak_bytes / GiB:.1f} GiB; trace / plan {tr.peak_bytes / found.plan.tensor_peak_bytes:.2f})",
               found.plan, tr, "–", time.perf_counter() - t0)


FIT_BUDGET = "27GiB"  # --only fit: issue 29's budget for Unsloth's setting


def fit_unsloth() -> str:
    """Unsloth's setting with ``memory.budget=27GiB memory.fit=trace`` and no other knob, checked as the trainer
    checks a run before it loads weights (``admit``): the planner's fit, traced, and fitted
    again below the budget while the trace is over (its rounds, then the fitted plan, print as they go)."""
    from benchmarks.surface import admit

    t0 = time.perf_counter()
    cfg = config(UNSLOTH + ["model.path=llama-3.1-8b", f"memory.budget={FIT_BUDGET}", "memory.fit=trace"])
    admission = admit(cfg, show=True)
    fitted, plan = admission.cfg, admission.plan
    m = fitted.memory
    return (f"llama-3.1-8b LoRA 8 x 20K, memory.budget={FIT_BUDGET} memory.fit=trace: optimizer {m.optimizer}, "
            f"rollout.max_batch_rows {fitted.rollout.max_batch_rows}, offload_activations {m.offload_activations}; "
            f"plan {plan.peak_bytes / GiB:.2f} GiB, host {plan.host_bytes / GiB:.2f} GiB "
            f"({time.perf_counter() - t0:.0f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=["oxen", "unsloth", "qlora", "window", "smallest", "fit"])
    ap.add_argument("--tiled-mlp", choices=["auto", "on", "off"],
                    help="memory.tiled_mlp for every setting (default: the config's default, auto)")
    args = ap.parse_args()
    if args.tiled_mlp:
        EXTRA.append(f"memory.tiled_mlp={args.tiled_mlp}")
    parts = args.only or ["oxen", "unsloth", "qlora"]
    out = ["| setting (simulated, cuda, bf16) | plan GiB | trace tensors GiB | trace device GiB | trace peak phase "
           "| published (TRL unless said) | trace s |", "|---|---:|---:|---:|---|---|---:|"]
    if "oxen" in parts:
        for model in ("qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b"):
            for i, (name, extra) in enumerate(OXEN_VARIANTS):
                t0 = time.perf_counter()
                plan, tr = plan_and_trace(model, OXEN + extra)
                pub = OXEN_PUBLISHED.get(model)
                out.append(row(f"{model} Oxen {name}", plan, tr, f"{pub[i]} GB" if pub else "–",
                               time.perf_counter() - t0))
                print(out[-1], file=sys.stderr, flush=True)
    if "unsloth" in parts:
        for extra, what in (([], ""), (["rollout.max_batch_rows=4"], ", decoding 4 rows at a time")):
            t0 = time.perf_counter()
            plan, tr = plan_and_trace("llama-3.1-8b", UNSLOTH + extra)
            out.append(row(f"llama-3.1-8b LoRA 8 x 20K (Unsloth's setting{what})", plan, tr,
                           "Unsloth 54.3 GB; TRL + FA2 510.8 GB", time.perf_counter() - t0))
            print(out[-1], file=sys.stderr, flush=True)
    if "qlora" in parts:
        for budget in (80 * GB, 24 * GB):
            out.extend(longest_fit("qwen3-8b", budget, QLORA)[1])
    if "window" in parts:  # Qwen3-8B's whole YaRN window, checkpoints offloaded to host memory
        t0 = time.perf_counter()
        T = 131_072 - 256
        plan, tr = plan_and_trace("qwen3-8b", QLORA + [f"rollout.max_completion_length={T}",
                                                       "memory.offload_activations=true"])
        out.append(row(f"qwen3-8b QLoRA + offload, T = {T:,} (S = 131,072; host: plan {plan.host_bytes / GiB:.1f}, "
                       f"trace {tr.host_peak_bytes / GiB:.1f} GiB)", plan, tr, "110K tokens on 80 GB (Unsloth)",
                       time.perf_counter() - t0))
    if "smallest" in parts:  # the least budget for Qwen3-8B QLoRA's whole window (the headline's N GB)
        out.append(smallest("qwen3-8b"))
    if "fit" in parts:  # not a table row: the fitted settings of Unsloth's setting under a 27 GiB budget
        print(fit_unsloth(), flush=True)
    if len(out) > 2:  # rows besides the header
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
