"""Every task of the GPU suite's children by name (``TASKS``), each a function of the child's ``ctx``
(``benchmarks/children/gpu_task.py``) returning ``{"rows": [...], "status": ...}``; rows go through ``ctx["run"]``
(``guard.run_guarded``: a time limit, the failure as the row's status, saved at once). With ``ctx["dry_run"]``
every first-call task does its setup (model folders, configs, plans) and no CUDA work; ``--device cpu --smoke``
runs the later sections on tiny shapes.

The first call's tasks: ``train`` / ``resume`` (train_e2e.py); ``oxen``: full GRPO steps at the Oxen settings on
the Qwen2.5-0.5B shape, full and LoRA, plan against peak allocated and reserved (run once with the default
allocator and once with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set by the driver); ``trl_pair``:
TRL 1.16 on the 0.5B pair, beside the ``oxen`` rows. The second call's: ``qlora_8b``, the 24 GB Qwen3-8B QLoRA
row of docs/benchmarks.md#issue-29-now, update only, offloaded checkpoints and 8-bit AdamW, device peak against
the plan and pinned host bytes against the plan's host line. The later sections, one task each (``--only``): ``loss``,
``update_only_long``, ``quantized``, ``rollout``, ``planner``, ``vs_trl``, ``long_context``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from benchmarks.gpu.guard import time_limit
from benchmarks.gpu.train_e2e import task_resume, task_train
from benchmarks.gpu.workloads import (QWEN3_8B, setup_dtype, shape_dict, shape_of, synthetic_corpus,
                                      write_prompts)
from benchmarks.harness.builders import build_model_folder
from benchmarks.harness.machine import version
from benchmarks.harness.memcap import MemoryCap

MIB = 2**20


# ----------------------------------------------------------------------------- the first call: memory, TRL


def allocator_label() -> str:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return "expandable_segments" if "expandable_segments:True" in conf else "default allocator"


def oxen_runs(ctx: dict) -> list[tuple[str, bool]]:
    """(shape, lora) of the Oxen rows: the 0.5B pair (full, LoRA); with the expandable allocator the full one
    alone (the allocator ratio needs one run)."""
    name = next(iter(ctx["cfg"]["shapes"]))
    runs = [(name, False), (name, True)]
    return runs[:1] if allocator_label() == "expandable_segments" else runs


def task_oxen(ctx: dict) -> dict:
    from benchmarks.gpu.measure import full_steps, plan_for, step_config

    c = ctx["cfg"]
    rows = []
    for name, lora in oxen_runs(ctx):
        shape = shape_of(name, c["shapes"][name])
        ov = step_config(lora, False, c["G"], c["P"], c["L"], setup_dtype(ctx))
        label = f"{name} {'LoRA' if lora else 'full'}, Oxen settings, {allocator_label()}"

        def one(shape=shape, ov=ov):
            if ctx["dry_run"]:
                plan = plan_for(shape, ov, "cuda")
                return {"plan_mib": plan.tensor_peak_bytes / MIB, "plan_phase": plan.peak_phase,
                        "dry_run": "plan only"}
            r = full_steps(shape, ov, ctx["dev"], c["steps_timed"])
            if r.get("peak_alloc_mib"):
                r["reserved_over_alloc"] = r["peak_reserved_mib"] / r["peak_alloc_mib"]
            return r

        row = ctx["run"](label, one)
        row.update(shape=name, lora=lora, checkpointing=False, allocator=allocator_label())
        rows.append(row)
    return {"rows": rows}


def task_qlora_8b(ctx: dict) -> dict:
    """The 24 GB row: Qwen3-8B shape, 4-bit NF4 base (random bf16 weights saved once, loaded in 4-bit),
    2 x (256 + 71,934) tokens, offloaded checkpoints, 8-bit AdamW, tiled MLP, update only."""
    import torch

    from benchmarks.gpu.measure import host_stats, long_context_step, plan_for, reset_host_peak, step_config

    s = ctx["cfg"]["long_ctx"]
    r = s["rows"][0]  # the 24 GB row (offloaded, 8-bit AdamW); --smoke: its tiny stand-in
    opt = r.get("optimizer", "adamw")
    spec = QWEN3_8B if s["shape"] == "qwen3-8b" else ctx["cfg"].get("long_shape")
    shape = shape_of(s["shape"], spec)
    label = (f"{s['shape']} QLoRA 2 x ({s['P']} + {r['L']:,}), {'offload' if r.get('offload') else 'no offload'} + "
             f"{'8-bit AdamW' if opt == 'adamw_8bit' else opt}, tiled MLP (24 GB row)")
    if ctx["dry_run"] or ctx["device"] != "cuda":
        def plan_only():
            ov = step_config(True, True, 2, s["P"], r["L"], "bfloat16", optimizer=opt, micro=1,
                             offload=r.get("offload", False), load_in_4bit=True)
            ov["memory"]["tiled_mlp"] = "on"
            plan = plan_for(shape, ov, "cuda")
            from benchmarks.gpu.measure import update_plan_mib

            return {"plan_mib": update_plan_mib(plan), "plan_host_mib": plan.host_bytes / MIB,
                    "dry_run": "plan only" if ctx["dry_run"] else "needs CUDA and bitsandbytes: plan only"}

        return {"rows": [ctx["run"](label, plan_only)]}
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:
        return {"rows": [], "status": f"not installed (bitsandbytes: {type(e).__name__}: {e})"[:300]}
    from benchmarks.surface import random_causal_lm

    folder = ctx["work"] / "qwen3_8b_random"

    def make_model():
        t = time.perf_counter()
        if not (folder / "config.json").is_file():  # a folder kept from an earlier call on the same machine
            partial = folder.with_name(folder.name + ".partial")  # renamed once whole: a kill leaves no half model
            model = random_causal_lm(shape, torch.bfloat16, ctx["dev"])
            model.save_pretrained(str(partial))
            del model
            os.replace(partial, folder)
            return {"save_s": time.perf_counter() - t}
        return {"save_s": None, "reused": str(folder)}

    rows = [ctx["run"]("random bf16 base saved (load in 4-bit follows)", make_model)]

    def step():
        reset_host_peak()
        out = long_context_step(shape, ctx["dev"], s["P"], r["L"], folder, True, offload=r.get("offload", False),
                                optimizer=opt)
        out.update(host_stats())
        if out.get("pinned_peak_mib"):
            out["host_ratio"] = out["plan_host_mib"] / out["pinned_peak_mib"]
        return out

    if rows[0]["status"] == "ok":
        rows.append(ctx["run"](label, step))
    return {"rows": rows}


def task_trl_pair(ctx: dict) -> dict:
    name = next(iter(ctx["cfg"]["shapes"]))
    oxen = [r for r in ctx.get("earlier", {}).get("memory", {}).get("rows", [])
            if r.get("allocator") == "default allocator"]
    if ctx["dry_run"]:
        write_prompts(ctx["work"] / "prompts.jsonl", 8)
        have = version("trl")
        return {"rows": [], "status": f"dry run: prompts written; trl {have or 'not installed'}"}
    return trl_rows(ctx, [name], oxen)


# ----------------------------------------------------------------------------- the later sections


def sec_loss(ctx: dict) -> dict:
    import torch

    from benchmarks.gpu.measure import loss_vs_naive

    s = ctx["cfg"]["loss"]
    dtype = torch.bfloat16 if ctx["device"] == "cuda" else torch.float32
    with time_limit(ctx["remaining"]()):
        rows = loss_vs_naive(s["tokens"], s["hidden"], s["vocab"], ctx["dev"], dtype, repeats=3)
    return {"rows": rows}


def sec_update_only_long(ctx: dict) -> dict:
    from benchmarks.gpu.measure import step_config, update_only

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

    from benchmarks.gpu.measure import quantized_step
    from benchmarks.surface import random_causal_lm

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

    from benchmarks.gpu.measure import rollout_vs_hf

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

    from benchmarks.gpu.measure import long_context_step
    from benchmarks.surface import random_causal_lm

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
    from benchmarks.gpu.measure import full_steps, step_config

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
    if version("trl") is None:
        return {"rows": [], "status": "not installed (trl)"}
    if not ctx["trl"]:
        return {"rows": [], "status": "skipped: --trl off"}
    from benchmarks.speed import vs_trl

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
                folder = build_model_folder(shape_dict(shape), dtype=dtype, root=ctx["work"] / "models",
                                            corpus=synthetic_corpus())
                s = vs_trl.Settings(workload="gpu-suite", model_path=str(folder), dtype=dtype, device=ctx["device"],
                                    prompts_path=str(prompts), num_generations=c["G"], completion_length=c["L"],
                                    max_prompt_length=c["P"], steps=c["steps_timed"], beta=0.0, lora=lora)
                r = vs_trl.run_one("trl", 1, s, ctx["work"] / "runs", MemoryCap(None), c["L"],
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


TASKS: dict[str, Callable[[dict], dict]] = {
    "train": task_train, "resume": task_resume, "oxen": task_oxen, "qlora_8b": task_qlora_8b,
    "trl_pair": task_trl_pair,
    "loss": sec_loss, "update_only_long": sec_update_only_long, "quantized": sec_quantized, "rollout": sec_rollout,
    "planner": sec_planner, "vs_trl": sec_vs_trl, "long_context": sec_long_context,
}
