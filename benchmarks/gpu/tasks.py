"""The GPU suite's later sections (``--only``): each runs inside a child of benchmarks/gpu_suite.py
(``_gpu_child.py``), with its own time limit per run; these are the measurements of the suite before issue
42 reordered it for a first GPU call (docs/benchmarks.md#gpu-suite). ``--device cpu --smoke`` runs them on
tiny shapes in CI."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any, Callable

LEGACY = ["loss", "update_only_long", "quantized", "rollout", "planner", "vs_trl", "long_context"]


class Budget(Exception):
    """A run was stopped (or not started) because its time budget was spent."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise Budget inside the block after ``seconds`` (main thread, SIGALRM); a no-op for <= 0."""
    if seconds <= 0:
        raise Budget("no time left")

    def handler(signum, frame):
        raise Budget(f"stopped after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- settings


def settings(smoke: bool) -> dict[str, Any]:
    """Sizes of every section: the real ones, or tiny ones for --smoke."""
    if smoke:
        tiny = {"family": "qwen2", "hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2,
                "vocab": 512, "tie": True, "max_positions": 512}
        tiny_llama = {**tiny, "family": "llama", "tie": False}
        return {"shapes": {"tiny-qwen2": tiny}, "long_shape": tiny_llama, "G": 2, "P": 8, "L": 8,
                "trl_shapes": ["tiny-qwen2"], "loss": {"tokens": 96, "hidden": 32, "vocab": 1000},
                "rollout": {"shape": "tiny-qwen2", "rows": 2, "prompt": 8, "new_tokens": 8, "repeats": 1},
                "long": {"shape": "tiny-llama", "rows": 2, "P": 8, "L": 64, "micro": 1},
                "quant": {"shape": "tiny-qwen2", "rows": 2, "P": 8, "L": 16}, "steps_timed": 2,
                "long_ctx": {"shape": "tiny-llama", "P": 8,
                             "rows": [{"L": 48, "offload": True}, {"L": 64}, {"L": 64, "offload": True}]}}
    return {"shapes": {n: None for n in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")}, "G": 4, "P": 256,
            "L": 786, "trl_shapes": ["qwen2.5-0.5b", "llama-3.2-1b"],
            "loss": {"tokens": 4096, "hidden": 896, "vocab": 151_936},
            "rollout": {"shape": "qwen2.5-0.5b", "rows": 8, "prompt": 64, "new_tokens": 256, "repeats": 2},
            "long": {"shape": "llama-3.1-8b", "rows": 8, "P": 256, "L": 20_000, "micro": 1},
            "quant": {"shape": "qwen2.5-0.5b", "rows": 4, "P": 256, "L": 786}, "steps_timed": 2,
            # docs/benchmarks.md#anchors-simulated (session 12): by trace P 256 + T 71,934 fits 24 GB with the
            # checkpoints offloaded and 8-bit AdamW; the whole 131,072 window (P 256 + T 130,816) fits 80 GB as
            # is, and with the checkpoints offloaded
            "long_ctx": {"shape": "qwen3-8b", "P": 256,
                         "rows": [{"L": 71_934, "offload": True, "optimizer": "adamw_8bit"}, {"L": 130_816},
                                  {"L": 130_816, "offload": True}]}}


QWEN3_8B = {"family": "qwen3", "hidden": 4096, "intermediate": 12288, "layers": 36, "heads": 32, "kv_heads": 8,
            "vocab": 151_936, "tie": False, "max_positions": 131_072, "head_dim": 128}  # its public config.json


def shape_of(name: str, spec: dict | None):
    from slimgrpo.spec.shape import ModelShape, load_shape

    return ModelShape(**spec) if spec else load_shape(name)


def shape_dict(shape) -> dict[str, Any]:
    return {"family": shape.family, "hidden": shape.hidden, "intermediate": shape.intermediate,
            "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads, "vocab": shape.vocab,
            "tie": shape.tie, "max_positions": shape.max_positions or 32_768}


# ----------------------------------------------------------------------------- sections


def sec_loss(ctx: dict) -> dict:
    import torch

    from _gpu_parts import loss_vs_naive

    s = ctx["cfg"]["loss"]
    dtype = torch.bfloat16 if ctx["device"] == "cuda" else torch.float32
    with time_limit(ctx["remaining"]()):
        rows = loss_vs_naive(s["tokens"], s["hidden"], s["vocab"], ctx["dev"], dtype, repeats=3)
    return {"rows": rows}


def sec_update_only_long(ctx: dict) -> dict:
    from _gpu_parts import step_config, update_only

    s = ctx["cfg"]["long"]
    shape = shape_of(s["shape"], ctx["cfg"].get("long_shape"))
    dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
    rows = []
    for offload in (False, True):
        name = f"{s['shape']} LoRA ckpt{' +offload' if offload else ''} {s['rows']}x{s['L']}"
        ov = step_config(True, True, s["rows"], s["P"], s["L"], dtype, micro=s["micro"], offload=offload)
        rows.append(ctx["run"](name, lambda ov=ov: update_only(shape, ov, ctx["dev"], s["rows"], s["P"], s["L"])))
    return {"rows": rows}


def sec_quantized(ctx: dict) -> dict:
    if ctx["device"] != "cuda":
        return {"rows": [{"name": w, "status": "skipped: needs CUDA"} for w in ("qlora", "adamw_8bit")],
                "status": "skipped: needs CUDA"}
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return {"rows": [{"name": w, "status": "not installed (bitsandbytes)"} for w in ("qlora", "adamw_8bit")],
                "status": "not installed"}
    import torch

    from _gpu_parts import quantized_step
    from slimgrpo.trace.synthetic import random_causal_lm

    s = ctx["cfg"]["quant"]
    shape = shape_of(s["shape"], ctx["cfg"]["shapes"].get(s["shape"]))
    folder = ctx["work"] / "qlora_model"

    def qlora():
        if not (folder / "config.json").is_file():
            random_causal_lm(shape, torch.bfloat16, ctx["dev"]).save_pretrained(str(folder))
        return quantized_step(shape, ctx["dev"], "qlora", s["rows"], s["P"], s["L"], folder)

    return {"rows": [ctx["run"]("qlora", qlora),
                     ctx["run"]("adamw_8bit", lambda: quantized_step(shape, ctx["dev"], "adamw_8bit", s["rows"],
                                                                     s["P"], s["L"], None))]}


def sec_rollout(ctx: dict) -> dict:
    import torch

    from _gpu_parts import rollout_vs_hf

    s = ctx["cfg"]["rollout"]
    shape = shape_of(s["shape"], ctx["cfg"]["shapes"].get(s["shape"]))
    dtype = torch.bfloat16 if ctx["device"] == "cuda" else torch.float32
    with time_limit(ctx["remaining"]()):
        rows = rollout_vs_hf(shape, ctx["dev"], dtype, s["rows"], s["prompt"], s["new_tokens"], s["repeats"])
    return {"rows": rows}


def sec_long_context(ctx: dict) -> dict:
    """QLoRA on CUDA with bitsandbytes (a random bf16 model saved once, loaded in 4-bit); elsewhere (the CPU
    smoke run) the same settings on a plain LoRA base."""
    import torch

    from _gpu_parts import long_context_step
    from slimgrpo.trace.synthetic import random_causal_lm

    s = ctx["cfg"]["long_ctx"]
    spec = QWEN3_8B if s["shape"] == "qwen3-8b" else ctx["cfg"].get("long_shape")
    shape = shape_of(s["shape"], spec)
    quantized = ctx["device"] == "cuda"
    if quantized:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return {"rows": [], "status": "not installed (bitsandbytes)"}
    folder = ctx["work"] / "long_ctx_model"

    def make_model():
        if quantized and not (folder / "config.json").is_file():
            random_causal_lm(shape, torch.bfloat16, ctx["dev"]).save_pretrained(str(folder))
        return {}

    rows = [ctx["run"]("random base saved", make_model)]
    for r in s["rows"]:
        offload, optimizer = r.get("offload", False), r.get("optimizer", "adamw")
        extras = "".join(f" + {w}" for w, on in (("offload", offload), ("8-bit AdamW", optimizer == "adamw_8bit"))
                         if on)
        rows.append(ctx["run"](f"{s['shape']} {'QLoRA' if quantized else 'LoRA'} 2 x ({s['P']} + {r['L']:,}), "
                               f"tiled MLP{extras}",
                               lambda r=r, o=offload, opt=optimizer: long_context_step(
                                   shape, ctx["dev"], s["P"], r["L"], folder, quantized, offload=o, optimizer=opt)))
    return {"rows": rows}


def planner_runs(cfg: dict) -> list[tuple[str, bool, bool]]:
    """(shape, lora, checkpointing), most wanted first: the TRL-paired runs, then checkpointing, then 1.5B."""
    names = list(cfg["shapes"])
    paired = [(n, lora, False) for n in cfg["trl_shapes"] for lora in (False, True)]
    rest = [(n, lora, ck) for n in names for ck in (False, True) for lora in (False, True)]
    return paired + [r for r in rest if r not in paired]


def sec_planner(ctx: dict) -> dict:
    from _gpu_parts import full_steps, step_config

    c = ctx["cfg"]
    dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
    rows = []
    for name, lora, ck in planner_runs(c):
        shape = shape_of(name, c["shapes"][name])
        steps = c["steps_timed"] if (name in c["trl_shapes"] and not ck) else 1
        ov = step_config(lora, ck, c["G"], c["P"], c["L"], dtype)
        label = f"{name} {'LoRA' if lora else 'full'} ckpt {'on' if ck else 'off'}"
        row = ctx["run"](label, lambda: full_steps(shape, ov, ctx["dev"], steps))
        row.update(shape=name, lora=lora, checkpointing=ck)
        rows.append(row)
    ctx["planner_rows"] = rows
    return {"rows": rows}


def sec_vs_trl(ctx: dict) -> dict:
    """TRL on the planner section's TRL-paired runs (0.5B and 1B, full and LoRA)."""
    earlier = ctx.get("earlier", {}).get("planner", {}).get("rows") or ctx.get("planner_rows", [])
    return trl_rows(ctx, ctx["cfg"]["trl_shapes"], earlier)


def trl_rows(ctx: dict, names: list[str], slim_rows: list[dict]) -> dict:
    """TRL 1.16 GRPOTrainer in a child process (vs_trl.run_one) for each shape of ``names``, full then LoRA,
    on the suite's settings, beside slimgrpo's rows of the same shape, LoRA setting and no checkpointing
    (``slim_rows``: rows with shape / lora / checkpointing keys)."""
    from common import _version

    if _version("trl") is None:
        return {"rows": [], "status": "not installed (trl)"}
    if not ctx["trl"]:
        return {"rows": [], "status": "skipped: --trl off"}
    import vs_trl
    import common

    c = ctx["cfg"]
    slim = {(r.get("shape"), r.get("lora")): r for r in slim_rows if not r.get("checkpointing")}
    prompts = write_prompts(ctx["work"] / "prompts.jsonl", 8)
    rows = []
    for name in names:
        shape = shape_of(name, c["shapes"][name])
        dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
        for lora in (False, True):
            label = f"{name} {'LoRA' if lora else 'full'}"

            def one(shape=shape, lora=lora):
                folder = common.build_model_folder(shape_dict(shape), dtype=dtype, root=ctx["work"] / "models",
                                                   corpus=synthetic_corpus())
                s = vs_trl.Settings(workload="gpu-suite", model_path=str(folder), dtype=dtype, device=ctx["device"],
                                    prompts_path=str(prompts), num_generations=c["G"], completion_length=c["L"],
                                    max_prompt_length=c["P"], steps=c["steps_timed"], beta=0.0, lora=lora)
                r = vs_trl.run_one("trl", 1, s, ctx["work"] / "runs", common.MemoryCap(None), c["L"],
                                   timeout=max(ctx["remaining"]() - 5, 1))  # the child is killed first
                if not r.ok:
                    raise RuntimeError(r.outcome.error or "TRL run failed")
                return {"trl_peak_alloc_mib": r.peak_cuda_mib(), "trl_peak_reserved_mib": r.peak_cuda_reserved_mib(),
                        "trl_s_per_step": r.s_per_step(), "trl_steps": len(r.steps)}

            row = ctx["run"](label, one)
            row.update(pair_with(row, slim.get((name, lora), {})))
            rows.append(row)
    return {"rows": rows}


def pair_with(trl_row: dict, mine: dict) -> dict:
    """slimgrpo's peak and s/step beside TRL's, and the two ratios where both were measured."""
    out: dict[str, Any] = {"slim_peak_alloc_mib": mine.get("peak_alloc_mib"), "slim_s_per_step": mine.get("s_per_step")}
    if trl_row.get("trl_peak_alloc_mib") and out["slim_peak_alloc_mib"]:
        out["vram_ratio"] = out["slim_peak_alloc_mib"] / trl_row["trl_peak_alloc_mib"]
    if trl_row.get("trl_s_per_step") and out["slim_s_per_step"]:
        out["time_ratio"] = out["slim_s_per_step"] / trl_row["trl_s_per_step"]
    return out


def synthetic_corpus() -> list[str]:
    """Text to train the benchmark tokenizer on (the GPU machine has no GSM8K copy)."""
    words = ["apple", "number", "plus", "minus", "times", "answer", "question", "total", "each", "more"]
    return [f"Question {i}: {words[i % 10]} {i} {words[(3 * i) % 10]} {i * 7 % 97} = {i * 13 % 89}. "
            f"The answer is {i % 41}." for i in range(2000)]


def write_prompts(path: Path, count: int) -> Path:
    """Prompts of about 200 tokens (the Oxen setting caps prompts at 256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = synthetic_corpus()
    rows = [{"prompt": " ".join(corpus[i * 20:(i + 1) * 20])[:700] + "\nAnswer:", "answer": "1"} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


RUNNERS: dict[str, Callable[[dict], dict]] = {
    "loss": sec_loss, "update_only_long": sec_update_only_long,
    "quantized": sec_quantized, "rollout": sec_rollout, "planner": sec_planner, "vs_trl": sec_vs_trl,
    "long_context": sec_long_context,
}


def run_guarded(label: str, fn: Callable[[], dict], ctx: dict) -> dict:
    """One measurement inside a section: its own time limit (what is left of the section's budget);
    a failure or an exhausted budget becomes the row's status. ``ctx["on_row"]`` (the child's) saves
    every finished row at once, so a child killed later still leaves it in the report."""
    import sys

    t = time.perf_counter()
    try:
        with time_limit(ctx["remaining"]()):
            row = {"name": label, "status": "ok", **fn()}  # fn may name its own status
    except Budget as e:
        row = {"name": label, "status": f"skipped: budget ({e})"}
    except Exception as e:
        row = {"name": label, "status": f"failed: {type(e).__name__}: {e}"[:400]}
        if "out of memory" in str(e).lower():
            row["status"] = "failed: CUDA out of memory"
    with contextlib.suppress(Exception):
        from _gpu_parts import fresh_memory

        fresh_memory(ctx["dev"])
    row["seconds"] = round(time.perf_counter() - t, 1)
    print(f"    {label}: {row['status']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    if ctx.get("on_row"):
        ctx["on_row"](row)
    return row
