"""The GPU suite's measurements, one function per kind of row. Each returns plain dicts (one row of a results
table); tasks.py calls them, guard.py adds the time limits and the error capture, suite.py the report.

Everything runs in the task's own process on random-init models (no downloads, no tokenizer) except the TRL
comparison, which needs a model folder and runs TRL in a child process (tasks.trl_rows).
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

import torch

from benchmarks.surface import ModelShape

MIB = 2**20


# ----------------------------------------------------------------------------- memory helpers


def fresh_memory(device: torch.device) -> None:
    """Free what earlier parts left and start a new peak (CUDA); a no-op elsewhere."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> tuple[float | None, float | None]:
    """(max_memory_allocated, max_memory_reserved) in MiB since the last fresh_memory; None off CUDA."""
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / MIB, torch.cuda.max_memory_reserved(device) / MIB


def reset_host_peak() -> None:
    """Start a new peak of pinned host memory for the next row: the caching host allocator's (CUDA, where this
    torch has the counter) and what slimgrpo pinned in place (the offload pool's and the bytes registered, which
    would otherwise carry the earlier rows' peaks into this one)."""
    if torch.cuda.is_available() and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
        torch.cuda.reset_peak_host_memory_stats()
    if torch.cuda.is_available():
        from benchmarks.surface import reset_pinned_peaks

        reset_pinned_peaks()


def host_stats() -> dict[str, Any]:
    """Pinned host memory in MiB: ``torch.cuda.host_memory_stats()`` (the caching host allocator that
    ``pin_memory=True`` draws from; blocks rounded up to powers of two) plus what slimgrpo pinned in place
    (``memory/pinned.py``: the offloaded activations' exact-size pool), as the run's
    ``memory/pinned_host_peak_mib`` adds them; {} off CUDA or where this torch has no such counter."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "host_memory_stats"):
        return {}
    try:
        stats = torch.cuda.host_memory_stats()
    except Exception as e:  # an older torch without the pinned allocator's statistics
        return {"host_stats_error": f"{type(e).__name__}: {e}"[:200]}

    def mib(*keys: str) -> float | None:
        for k in keys:
            if k in stats:
                return stats[k] / MIB
        return None

    cached = mib("allocated_bytes.peak", "reserved_bytes.peak")
    try:  # the offload's exact-size pool pins in place (cudaHostRegister): not in host_memory_stats
        from benchmarks.surface import registered_bytes

        registered = registered_bytes()[1] / MIB
    except Exception:
        registered = None
    return {"pinned_peak_mib": (cached or 0.0) + (registered or 0.0) if cached is not None or registered else None,
            "pinned_cached_peak_mib": cached, "pinned_registered_peak_mib": registered,
            "pinned_active_peak_mib": mib("active_bytes.peak"),
            "pinned_now_mib": mib("allocated_bytes.current", "reserved_bytes.current"),
            "host_stats_keys": sorted(k for k in stats if "bytes" in k)[:24]}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- planner vs peak, full steps


def run_config(overrides: dict[str, Any]):
    from benchmarks.surface import update_config

    return update_config(overrides)


def step_config(lora: bool, ckpt: bool, G: int, P: int, L: int, dtype: str, optimizer: str = "adamw",
                micro: int | None = None, offload: bool = False, load_in_4bit: bool = False,
                beta: float = 0.0) -> dict[str, Any]:
    """Config overrides of one suite run (the Oxen settings when G=4, P=256, L=786)."""
    return {
        "model": {"dtype": dtype, "load_in_4bit": load_in_4bit},
        "lora": {"enabled": lora, "r": 16, "alpha": 32.0, "dropout": 0.0},
        "data": {"max_prompt_length": P},
        "rollout": {"num_generations": G, "max_completion_length": L, "min_completion_length": L},
        "loss": {"beta": beta, "loss_type": "dapo"},
        "memory": {"gradient_checkpointing": ckpt, "micro_batch_size": micro, "offload_activations": offload,
                   "optimizer": optimizer},
        "optim": {"learning_rate": 1e-6, "max_grad_norm": 1.0},
        "run": {"batch_size": G},
    }


def update_plan_mib(plan) -> float:
    """Planned tensors of the update phase alone (always + update, no framework overhead): what an
    update-only run (no generation) should peak at."""
    return (plan.phase_total("always") + plan.phase_total("update") - plan.framework_bytes) / MIB


def plan_for(shape: ModelShape, overrides: dict[str, Any], device: str):
    from benchmarks.surface import plan_memory, run_spec

    cfg = run_config(overrides)
    return plan_memory(shape, run_spec(cfg, device, vocab=shape.vocab))


def _update_runner(shape: ModelShape, overrides: dict[str, Any], device: torch.device, seed: int):
    """``(cfg, plan, model, UpdateOnly runner)`` for a random-init model of ``shape`` on ``device``, memory
    counters reset first so the peak that follows is this run's."""
    from benchmarks.surface import UpdateOnly, random_causal_lm

    cfg = run_config(overrides)
    plan = plan_for(shape, overrides, device.type)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg.model.dtype]
    fresh_memory(device)
    model = random_causal_lm(shape, dtype, device, seed=seed)
    return cfg, plan, model, UpdateOnly(cfg, model, device)


def full_steps(shape: ModelShape, overrides: dict[str, Any], device: torch.device, steps: int,
               seed: int = 0) -> dict[str, Any]:
    """``steps`` GRPO steps minus data and rewards: the rollout engine samples L tokens per row for
    random prompt ids (EOS forbidden until L: the work is pinned), random group-normalised advantages
    stand in for rewards, then the trainer's own update stage (Updater.update). Peak CUDA memory
    over all steps (weights included) against the plan; s/step = the last step (the first warms up)."""
    from benchmarks.surface import SamplingParams, TorchRolloutEngine, synthetic_advantages

    cfg, plan, model, runner = _update_runner(shape, overrides, device, seed)
    engine = TorchRolloutEngine(runner.model, max_batch_rows=cfg.rollout.max_batch_rows)
    G, P, L = cfg.rollout.num_generations, cfg.data.max_prompt_length, cfg.rollout.max_completion_length
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_new_tokens=L, min_new_tokens=L, temperature=1.0, top_p=1.0, top_k=0,
                            eos_token_ids=(1,), pad_token_id=0)
    gen = torch.Generator(device=device).manual_seed(seed)
    times, gen_times = [], []
    for _ in range(steps):
        prompts = [torch.randint(2, shape.vocab, (P,), generator=g).tolist() for _ in range(cfg.prompts_per_step)]
        t = time.perf_counter()
        rollout = engine.generate(prompts, G, params, gen)
        sync(device)
        gen_times.append(time.perf_counter() - t)
        runner.step(rollout, synthetic_advantages(rollout.rows, G))
        times.append(time.perf_counter() - t)
    alloc, reserved = peak_mib(device)
    del engine, runner, model
    fresh_memory(device)
    return {"plan_mib": plan.tensor_peak_bytes / MIB, "plan_phase": plan.peak_phase,
            "plan_with_overhead_mib": plan.peak_bytes / MIB, "peak_alloc_mib": alloc, "peak_reserved_mib": reserved,
            "ratio": plan.tensor_peak_bytes / MIB / alloc if alloc else None,
            "s_per_step": times[-1], "gen_s": gen_times[-1], "steps": steps,
            "gen_tokens_per_s": G * cfg.prompts_per_step * L / gen_times[-1]}


def update_only(shape: ModelShape, overrides: dict[str, Any], device: torch.device, rows: int, P: int, L: int,
                steps: int = 1, seed: int = 0) -> dict[str, Any]:
    """The update alone on synthetic completions (no decoding): peak and s/update against the plan."""
    from benchmarks.surface import synthetic_rollout

    cfg, plan, model, runner = _update_runner(shape, overrides, device, seed)
    G = cfg.rollout.num_generations
    times = []
    for i in range(steps):
        rollout = synthetic_rollout(rows // G, G, P, L, shape.vocab, device=device, seed=seed + i)
        times.append(runner.step(rollout).seconds)
    alloc, reserved = peak_mib(device)
    del runner, model
    fresh_memory(device)
    planned = update_plan_mib(plan)
    return {"plan_mib": planned, "plan_full_step_mib": plan.tensor_peak_bytes / MIB, "plan_phase": plan.peak_phase,
            "peak_alloc_mib": alloc, "peak_reserved_mib": reserved, "ratio": planned / alloc if alloc else None,
            "s_per_update": times[-1], "tokens": rows * L}


# ----------------------------------------------------------------------------- chunked loss


def loss_vs_naive(tokens: int, hidden: int, vocab: int, device: torch.device, dtype: torch.dtype,
                  repeats: int = 3) -> list[dict[str, Any]]:
    """Forward + backward of the LM-head log-probs of ``tokens`` tokens: chunked (fp32 accumulation
    over bf16 weights) against the naive [N, V] logits; time (median), extra peak memory, agreement."""
    from benchmarks.harness.from_tests import load_naive_token_logprobs
    from benchmarks.surface import HeadSpec, chunked_token_logprobs

    naive_token_logprobs = load_naive_token_logprobs()  # the full-logits baseline lives with the tests

    g = torch.Generator().manual_seed(0)
    h0 = (torch.randn(tokens, hidden, generator=g) * 0.5).to(device, dtype)
    w0 = (torch.randn(vocab, hidden, generator=g) * 0.02).to(device, dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    rows, results = [], {}
    for name, fn in (("chunked", chunked_token_logprobs), ("naive", naive_token_logprobs)):
        times = []
        for _ in range(repeats):
            h = h0.clone().requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            fresh_memory(device)
            base = torch.cuda.memory_allocated(device) / MIB if device.type == "cuda" else None
            t = time.perf_counter()
            logp, _ = fn(h, HeadSpec(w), targets)
            logp.sum().backward()
            sync(device)
            times.append(time.perf_counter() - t)
            alloc, _ = peak_mib(device)
        results[name] = (logp.detach().float(), h.grad.float(), w.grad.float())
        rows.append({"path": name, "tokens": tokens, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
                     "s_fwd_bwd": statistics.median(times[1:] if len(times) > 1 else times),
                     "extra_peak_mib": alloc - base if alloc is not None else None})
        del h, w, logp
    c, n = results["chunked"], results["naive"]
    agree = {"max_abs_logp_diff": float((c[0] - n[0]).abs().max()),
             "max_rel_grad_w_diff": float((c[2] - n[2]).norm() / n[2].norm().clamp(min=1e-30))}
    for r in rows:
        r.update(agree)
    return rows


# ----------------------------------------------------------------------------- rollout


def rollout_vs_hf(shape: ModelShape, device: torch.device, dtype: torch.dtype, rows: int, prompt_len: int,
                  new_tokens: int, repeats: int = 2) -> list[dict[str, Any]]:
    """Tokens/s of TorchRolloutEngine against HF generate: one prompt, ``rows`` samples of exactly
    ``new_tokens`` tokens each (EOS forbidden before), temperature 1; runs alternate, median reported."""
    from benchmarks.surface import SamplingParams, TorchRolloutEngine, random_causal_lm

    fresh_memory(device)
    model = random_causal_lm(shape, dtype, device).eval()
    engine = TorchRolloutEngine(model)
    prompt = torch.randint(2, shape.vocab, (prompt_len,), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, temperature=1.0, top_p=1.0,
                            top_k=0, eos_token_ids=(1,), pad_token_id=0)
    times: dict[str, list[float]] = {"hf_generate": [], "slimgrpo": []}
    graphs = device.type == "cuda"  # also the opt-in static-cache + CUDA-graph decode (rollout/cuda_graph.py)
    if graphs:
        times["slimgrpo_cuda_graphs"] = []
    for _ in range(repeats):
        ids = prompt.unsqueeze(0).to(device)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, min_new_tokens=new_tokens,
                                 max_new_tokens=new_tokens, num_return_sequences=rows, pad_token_id=0,
                                 eos_token_id=1)
        sync(device)
        times["hf_generate"].append(time.perf_counter() - t)
        assert out.shape == (rows, prompt_len + new_tokens), out.shape
        t = time.perf_counter()
        ro = engine.generate([prompt.tolist()], rows, params)
        sync(device)
        times["slimgrpo"].append(time.perf_counter() - t)
        assert ro.completion_ids.shape == (rows, new_tokens)
        if graphs:
            import os

            from benchmarks.surface import CUDA_GRAPH_ENV

            os.environ[CUDA_GRAPH_ENV] = "1"
            try:
                t = time.perf_counter()
                ro = engine.generate([prompt.tolist()], rows, params)
                sync(device)
                times["slimgrpo_cuda_graphs"].append(time.perf_counter() - t)
            finally:
                os.environ.pop(CUDA_GRAPH_ENV, None)
    del engine, model
    fresh_memory(device)
    hf = statistics.median(times["hf_generate"])
    out_rows = []
    for name, ts in times.items():
        s = statistics.median(ts)
        out_rows.append({"engine": name, "rows": rows, "prompt": prompt_len, "new_tokens": new_tokens,
                         "seconds": s, "tokens_per_s": rows * new_tokens / s, "speedup_vs_hf": hf / s})
    return out_rows


# ----------------------------------------------------------------------------- QLoRA / 8-bit AdamW


def quantized_step(shape: ModelShape, device: torch.device, which: str, rows: int, P: int, L: int,
                   folder) -> dict[str, Any]:
    """One update-only step with a 4-bit NF4 base (QLoRA, loaded through slimgrpo.modeling.load_model
    from ``folder``) or with bitsandbytes 8-bit AdamW (full fine-tuning)."""
    from benchmarks.surface import ModelConfig, UpdateOnly, load_model, random_causal_lm, synthetic_rollout

    G = 2
    if which == "qlora":
        overrides = step_config(True, True, G, P, L, "bfloat16", load_in_4bit=True)
    else:
        overrides = step_config(False, True, G, P, L, "bfloat16", optimizer="adamw_8bit")
    cfg = run_config(overrides)
    plan = plan_for(shape, overrides, device.type)
    fresh_memory(device)
    if which == "qlora":
        model = load_model(ModelConfig(path=str(folder), load_in_4bit=True), device, torch.bfloat16)
    else:
        model = random_causal_lm(shape, torch.bfloat16, device)
    runner = UpdateOnly(cfg, model, device)
    res = runner.step(synthetic_rollout(rows // G, G, P, L, shape.vocab, device=device))
    res2 = runner.step(synthetic_rollout(rows // G, G, P, L, shape.vocab, device=device, seed=1))
    alloc, reserved = peak_mib(device)
    opt = type(runner.updater.optimizer).__module__ + "." + type(runner.updater.optimizer).__name__
    del runner, model
    fresh_memory(device)
    ok = all(map(lambda x: x == x and abs(x) != float("inf"), (res.loss, res2.loss, res2.grad_norm)))
    planned = update_plan_mib(plan)
    return {"what": which, "optimizer": opt, "finite": ok, "plan_mib": planned,
            "peak_alloc_mib": alloc, "peak_reserved_mib": reserved,
            "ratio": planned / alloc if alloc else None, "s_per_update": res2.seconds}


# ----------------------------------------------------------------------------- long context (issue 29)


def long_context_step(shape: ModelShape, device: torch.device, P: int, L: int, folder, quantized: bool,
                      offload: bool = False, optimizer: str = "adamw") -> dict[str, Any]:
    """One update-only step of 2 rows x (P + L) tokens on Qwen3-8B-style QLoRA (4-bit NF4 base loaded from
    ``folder`` when ``quantized``, else a LoRA on a random base), gradient checkpointing, one row per
    micro-batch, the MLP tiled (``memory.tiled_mlp=on``), checkpoints offloaded when ``offload``, the given
    ``memory.optimizer``: the settings of docs/benchmarks.md#anchors-simulated, measured. Peak CUDA memory
    against the plan."""
    from benchmarks.surface import ModelConfig, UpdateOnly, load_model, random_causal_lm, synthetic_rollout, tile_mlps

    G = 2
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    overrides = step_config(True, True, G, P, L, dtype, optimizer=optimizer, micro=1, offload=offload,
                            load_in_4bit=quantized)
    overrides["memory"]["tiled_mlp"] = "on"
    cfg = run_config(overrides)
    plan = plan_for(shape, overrides, device.type)
    fresh_memory(device)
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    if quantized:
        model = load_model(ModelConfig(path=str(folder), load_in_4bit=True), device, torch_dtype)
    else:
        model = random_causal_lm(shape, torch_dtype, device)
    runner = UpdateOnly(cfg, model, device)
    tiled = tile_mlps(runner.model)
    res = runner.step(synthetic_rollout(1, G, P, L, shape.vocab, device=device))
    alloc, reserved = peak_mib(device)
    del runner, model
    fresh_memory(device)
    planned = update_plan_mib(plan)
    finite = res.loss == res.loss and abs(res.loss) != float("inf")
    return {"tokens": G * (P + L), "quantized": quantized, "offload": offload, "optimizer": optimizer,
            "tiled_mlps": tiled.tiled,
            "finite": finite, "plan_mib": planned, "plan_host_mib": plan.host_bytes / MIB,
            "peak_alloc_mib": alloc, "peak_reserved_mib": reserved,
            "ratio": planned / alloc if alloc else None, "s_per_update": res.seconds}

