"""The plan's lines for ``rollout.engine=vllm``: a ``vllm.LLM`` colocated in the training process holds its own
copy of the weights (in ``rollout.vllm_dtype``), a KV-cache pool and its runtime, in place of the built-in
engine's KV cache, logits and decode copies.

- **CPU**: the copy, the pool (``rollout.vllm_kv_cache_gb``, or sized as the engine sizes it: one step's rows at
  prompt + completion length, ``KV_HEADROOM`` more for block rounding, at least ``MIN_KV_BYTES``) and vLLM's
  import and engine modules (``VLLM_CPU_IMPORT_BYTES``, measured), all for the whole run: vLLM has no sleep
  mode on CPU.
- **CUDA**: vLLM claims ``rollout.vllm_gpu_memory_utilization`` of the GPU's memory (weights, activations and a
  KV pool that fills the rest); where the GPU is not known here (a plan made off the machine), the copy, the
  default pool and ``VLLM_CUDA_WORKSPACE_BYTES`` stand in, a lower bound. With ``rollout.vllm_sleep_mode`` (level
  2) the claim is freed before the update, so it counts in the generation phase only; what sleep leaves behind
  is not measured yet (the GPU suite's vLLM rows will).

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


def vllm_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    """The vLLM engine's lines (module docstring), in place of the built-in engine's generation lines."""
    Bv = x.vllm_weight_bytes or x.param_dtype_bytes
    N = shape.num_params
    rows = min(x.generation_batch_rows or x.rows, x.rows)
    tokens = rows * x.seq_len
    if x.vllm_kv_cache_bytes is not None:
        kv, kv_what = x.vllm_kv_cache_bytes, "rollout.vllm_kv_cache_gb"
    else:
        kv = vllm_kv_pool_bytes(shape.layers, shape.kv_heads, shape.head_dim, tokens, Bv)
        kv_what = (f"max(64 MiB, {KV_HEADROOM}·2·{Bv}·L·kv_heads·head_dim·rows·S) = {KV_HEADROOM}·2·{Bv}·"
                   f"{shape.layers}·{shape.kv_heads}·{shape.head_dim}·{rows}·{_n(x.seq_len)}")
    out = []
    if x.device == "cpu":
        out += [Component("vLLM weights", N * Bv, "always", f"vLLM's own copy, N·{Bv} B = {_n(N)}·{Bv}"),
                Component("vLLM KV pool", kv, "always", kv_what),
                Component("vLLM runtime", VLLM_CPU_IMPORT_BYTES, "always",
                          "measured RSS of vLLM's engine modules beside torch + transformers")]
    else:
        phase = "generation" if x.vllm_sleep else "always"
        slept = ", freed before the update (sleep mode)" if x.vllm_sleep else " (no sleep mode: held throughout)"
        if x.gpu_total_bytes:
            claim = int(x.vllm_gpu_memory_utilization * x.gpu_total_bytes)
            out.append(Component("vLLM engine", claim, phase,
                                 f"gpu_memory_utilization·GPU memory = {x.vllm_gpu_memory_utilization}·"
                                 f"{_n(x.gpu_total_bytes)}: weights, activations, KV pool{slept}"))
        else:
            out += [Component("vLLM weights", N * Bv, phase, f"N·{Bv} B = {_n(N)}·{Bv}{slept}"),
                    Component("vLLM KV pool", kv, phase, f"{kv_what} (at least: vLLM fills "
                              f"gpu_memory_utilization {x.vllm_gpu_memory_utilization} of the GPU)"),
                    Component("vLLM workspace", VLLM_CUDA_WORKSPACE_BYTES, phase,
                              "activations and CUDA graphs (a stand-in, not measured)")]
    converted = x.lora or Bv != x.param_dtype_bytes
    if converted:
        largest = max([shape.vocab * shape.hidden] + [i * o for i, o in shape.linear_dims().values()])
        out.append(Component("vLLM weight sync", largest * Bv, "generation",
                             f"one tensor converted at a time ({'LoRA merged' if x.lora else 'dtype'}): the largest "
                             f"{_n(largest)}·{Bv} B"))
    return out
