"""The plan's generation phase on our engine (rollout/engine.py): the KV cache, the logits being sampled, the
prefill's working set, and what CPU decoding holds beside the weights (oneDNN-packed or LoRA-merged copies).
vLLM's lines are plan/vllm.py's; which projections CPU decoding packs is ``planner.decode_packing``."""

from __future__ import annotations

import math

from slimgrpo.plan.formulas import (GEN_LOGITS_COPIES, LORA_ADAPTER_BYTES, PREFILL_CHUNK_TOKENS, _compute_bytes, _n,
                                    attention_mask_bytes, inference_bytes_per_token_layer, kv_cache_bytes,
                                    lora_targets)
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.types import Component, PlanInputs


def generation_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    B = _compute_bytes(x)
    gen_rows = min(x.generation_batch_rows or x.rows, x.rows)
    S, P, V = x.seq_len, x.max_prompt_length, shape.vocab
    if x.kv_cache_dtype == "auto":
        kv = kv_cache_bytes(shape.layers, S, shape.kv_heads, shape.head_dim, gen_rows, B)
        kv_what = f"2·B·L·S·kv_heads·head_dim·rows = 2·{B}·{shape.layers}·{_n(S)}·{shape.kv_heads}·{shape.head_dim}"
    else:
        # one byte per value + an fp32 scale per (token, head); each step dequantises one layer's K and V
        per_value = 1 + 4 / shape.head_dim
        kv = math.ceil(kv_cache_bytes(shape.layers, S, shape.kv_heads, shape.head_dim, gen_rows, 1) * per_value)
        kv += kv_cache_bytes(1, S, shape.kv_heads, shape.head_dim, gen_rows, B)
        kv_what = (f"{x.kv_cache_dtype}: 2·(1 + 4/head_dim)·L·S·kv_heads·head_dim·rows + one layer dequantised "
                   f"2·B·S·kv_heads·head_dim·rows; L {shape.layers}, S {_n(S)}, kv_heads {shape.kv_heads}, "
                   f"head_dim {shape.head_dim}")
    head_out = 0 if B == 4 else B  # a 16-bit head's output, widened to fp32 for sampling
    head_note = " (the head's 16-bit output beside them)" if head_out else ""
    groups = min(x.prompts_per_step, math.ceil(gen_rows / x.num_generations))
    chunk = min(P, PREFILL_CHUNK_TOKENS)  # queries of one prefill chunk, against up to P keys
    prefill = groups * chunk * inference_bytes_per_token_layer(shape, x)
    mask_shared, mask_layer = attention_mask_bytes(x, groups, P, shape=shape, pairs=groups * chunk * P)
    prefill += mask_shared + mask_layer
    return [
        *decode_weight_components(shape, x),
        Component("KV cache", kv, "generation", f"{kv_what}·{gen_rows}"),
        Component("generation logits", gen_rows * V * (4 * GEN_LOGITS_COPIES + head_out), "generation",
                  f"rows·V·({GEN_LOGITS_COPIES}·4{f' + {head_out}' if head_out else ''}) = {_n(gen_rows)}·{_n(V)}·"
                  f"{4 * GEN_LOGITS_COPIES + head_out}{head_note}"),
        Component("prefill working set", prefill, "generation",
                  f"groups·min(P, chunk)·(one layer, no grad) + chunk·P terms = {groups}·{_n(chunk)}·"
                  f"{_n(inference_bytes_per_token_layer(shape, x))} + {_n(mask_shared + mask_layer)}"),
    ]


# Below this many bytes of decoder projections (float32) CPU decoding packs the LM head only: the bundled demo
# model (0.5 MB of projections) decoded ~2-8% faster packed, but oneDNN's kernel cache took its peak RSS from
# 451 to 584 MiB; SmolLM2-135M (425 MB) decodes ~1.5x faster packed, under its update's peak.
DECODE_PACK_MIN_BYTES = 64 * 2**20


def decode_weight_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
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
                          f"stacked)·4 = ({shape.layers}·{_n(per_layer)} + {_n(head)} + {_n(group)})·4")]
    packed_head = [Component("decode weights", head * 4, "generation",
                             f"cpu fp32 decode: oneDNN-packed LM head V·H·4 = {_n(head)}·4")] if Bp == 4 else []
    if not x.lora:
        return packed_head
    targets = lora_targets(x.lora_target_modules)
    merged = shape.layers * sum(dims[m][0] * dims[m][1] for m in targets)
    largest = max(dims[m][0] * dims[m][1] for m in targets)
    extra = packed_head[0].bytes if packed_head else 0
    return [Component("decode weights", merged * Bp + largest * LORA_ADAPTER_BYTES + extra, "generation",
                      f"cpu decode through W + scale·B·A: L·Σ in·out·{Bp} B + one delta ·{LORA_ADAPTER_BYTES} B "
                      f"= {shape.layers}·{_n(merged // shape.layers)}·{Bp} + {_n(largest)}·{LORA_ADAPTER_BYTES}"
                      + (f" + packed LM head {_n(head)}·4" if extra else ""))]


def small_projections(shape: ModelShape) -> bool:
    """Float32 decoder projections under ``DECODE_PACK_MIN_BYTES``: not worth packing."""
    return shape.layers * shape.layer_linear_params * 4 < DECODE_PACK_MIN_BYTES
