"""The memory planner: a pure function from (model shape, run settings) to bytes per component.

    plan = plan_memory(load_shape("llama-3.1-8b"), PlanInputs(device="cuda", lora=True, ...))
    plan.peak_bytes, plan.peak_phase, plan.components

A GRPO step has two memory phases on top of what is always resident:

    always      weights, adapters, optimizer state, reference copy (CPU runs), rollout and
                log-prob buffers, framework overhead
    generation  KV cache, per-step sampling logits, prompt prefill working set
    update      gradients, saved activations, attention mask, loss working set

    peak = always + max(generation, update)

Symbols used in the formulas (and in the ``formula`` strings of the plan):
    N params, L layers, H hidden, I intermediate, V vocab, q = heads·head_dim, kv = kv_heads·head_dim,
    B activation/compute bytes (2 for bf16/fp16, 4 for fp32), G num_generations,
    rows = prompts_per_step·G, m = micro_batch_rows, P/T max prompt/completion length, S = P + T.

Every modelling constant lives in one block at the top of ``formulas.py`` (with the closed-form formulas)
so that calibration (docs/memory.md) can adjust them in one place; this module re-exports them. The
derivations are in docs/memory.md.
"""

from __future__ import annotations

import dataclasses
import math

from slimgrpo.memory import attention as attn_kernels
# The constants and closed-form formulas live in formulas.py; imported here, so callers may import them from here.
from slimgrpo.plan.formulas import (ADAMW_8BIT_BYTES_PER_PARAM, ADAMW_STATES, BACKWARD_WORKSPACE_LAYERS,
                       CHECKPOINT_RECOMPUTE_LAYERS, CPU_ADAMW_STEP_TEMPORARIES, CPU_FRAMEWORK_OVERHEAD_BYTES,
                       CUDA_FRAMEWORK_OVERHEAD_BYTES, MASTER_WEIGHT_BYTES, CUDA_TRACE_MARGIN, FULL_LOGITS_COPIES,
                       GRAD_ACCUMULATION_TEMPORARIES, GiB, KiB, LORA_ADAPTER_BYTES, LOSS_BLOCKS_FUSED,
                       LOSS_BLOCKS_SEPARATE, LOSS_BLOCKS_SEPARATE_EXTRA, LOSS_CHUNK_HIDDEN_TEMPORARIES,
                       LOSS_PER_TOKEN_TENSORS, NORM_BACKWARD_FP32_TENSORS, NORM_BACKWARD_RESIDUAL_GRADS, MiB,
                       NF4_BYTES_PER_PARAM, OFFLOAD_RESIDENT_LAYERS, offloaded_bytes,
                       PREFILL_CHUNK_TOKENS, QLORA_COMPUTE_BYTES, TILED_MLP_AUTO_TOKENS, TILED_MLP_BACKWARD_BUFFERS,
                       TILED_MLP_MIN_GAIN, TOKENIZER_BYTES_PER_VOCAB, _compute_bytes, _n, _tiles,
                       activation_bytes_per_token_layer,
                       attention_mask_bytes, inference_bytes_per_token_layer, kv_cache_bytes, logits_bytes,
                       fp32_master, lora_num_params, lora_targets, mlp_bytes_per_token, norm_backward_bytes_per_token,
                       tokenizer_bytes)
from slimgrpo.memory.tiled_mlp import tiled_shard_tokens
from slimgrpo.plan.types import PHASES, Component, MemoryPlan, PlanInputs
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.sharding import shard_components
from slimgrpo.plan.vllm import vllm_components, vllm_start_note
from slimgrpo.plan.critic import critic_components
from slimgrpo.plan.generation import generation_components, small_projections

# Component, MemoryPlan, PHASES and PlanInputs are re-exported: callers import them from here.
__all__ = ["Component", "MemoryPlan", "PHASES", "PlanInputs", "plan_memory", "logits_bytes", "kv_cache_bytes",
           "lora_num_params", "activation_bytes_per_token_layer", "attention_mask_bytes", "update_layer_bytes",
           "shared_prompt_groups", "mlp_bytes_per_token", "tiled_mlp_on", "tiled_shard_tokens"]

# ----------------------------------------------------------------------------------------------
# Component builders (each returns Components; plan_memory puts them together)
# ----------------------------------------------------------------------------------------------
def _weight_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    N, Bp = shape.num_params, x.param_dtype_bytes
    out: list[Component] = []
    if x.load_in_4bit:
        quantised = shape.layers * shape.layer_linear_params
        rest = N - quantised
        b = math.ceil(quantised * NF4_BYTES_PER_PARAM) + rest * QLORA_COMPUTE_BYTES
        out.append(Component("weights", b, "always",
                             f"{_n(quantised)} projection weights · {NF4_BYTES_PER_PARAM:.4f} B (NF4) + "
                             f"{_n(rest)} others · {QLORA_COMPUTE_BYTES} B"))
    else:
        out.append(Component("weights", N * Bp, "always", f"N·{Bp} B = {_n(N)}·{Bp}"))
    if x.lora:
        n = lora_num_params(shape, x.lora_rank, x.lora_target_modules)
        out.append(Component("LoRA adapters", n * LORA_ADAPTER_BYTES, "always",
                             f"L·Σ r·(in+out) · {LORA_ADAPTER_BYTES} B = {_n(n)}·{LORA_ADAPTER_BYTES}"))

    if not x.needs_reference:
        out.append(Component("reference policy", 0, "always", "beta = 0: no reference model"))
    elif x.lora:
        out.append(Component("reference policy", 0, "always", "LoRA: base with adapters disabled, no copy"))
    elif x.device == "cuda" and x.reference_placement == "device":
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy kept on the device, N·{Bp} B = {_n(N)}·{Bp}"))
    elif x.device == "cuda":
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy kept in host RAM, N·{Bp} B = {_n(N)}·{Bp}",
                             location="host"))
        if x.reference_placement in ("stream", "auto"):
            out.append(_reference_stream_component(shape, x))
    else:
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy, N·{Bp} B = {_n(N)}·{Bp}"))
    return out


def _reference_stream_component(shape: ModelShape, x: PlanInputs) -> Component:
    """memory.reference_placement=stream (update/reference.py): during the reference pass the modules
    outside the decoder layers (embedding, head when untied, norms) and two layers (one computing, the next in
    flight) are on the device. The pass runs before the update, when its gradients and activations are not
    alive: plan_memory keeps only what exceeds them (``_overlap_reference_stream``)."""
    Bp, L = x.param_dtype_bytes, shape.layers
    layer = shape.layer_params
    rest = shape.num_params - L * layer
    resident = min(2, L)
    return Component("reference stream", (rest + resident * layer) * Bp, "update",
                     f"streamed reference: embedding/head/norms + {resident} layers, "
                     f"({_n(rest)} + {resident}·{_n(layer)})·{Bp} B")


def _trainable(shape: ModelShape, x: PlanInputs) -> tuple[int, int, int]:
    """(trainable params, their bytes per value, largest trainable tensor in params)."""
    if x.lora:
        n = lora_num_params(shape, x.lora_rank, x.lora_target_modules)
        dims = shape.linear_dims()
        largest = max(x.lora_rank * max(dims[m]) for m in lora_targets(x.lora_target_modules))
        return n, LORA_ADAPTER_BYTES, largest
    largest = max(shape.embedding_params, max(i * o for i, o in shape.linear_dims().values()))
    return shape.num_params, x.param_dtype_bytes, largest


def _optimizer_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    n, b, largest = _trainable(shape, x)
    what = "LoRA params" if x.lora else "params"
    grads = Component("gradients", n * b, "always", f"{what}·{b} B = {_n(n)}·{b}, in DDP's all-reduce buckets "
                      "(gradient_as_bucket_view): held all run") if x.ddp else \
        Component("gradients", n * b, "update", f"{what}·{b} B = {_n(n)}·{b}")
    master = fp32_master(x)
    if master:  # the moments follow the float32 master copy the step updates
        state = Component("optimizer state", n * MASTER_WEIGHT_BYTES * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments in float32 (master weights): "
                          f"{_n(n)}·{ADAMW_STATES}·{MASTER_WEIGHT_BYTES} B")
    elif x.optimizer == "adamw":
        state = Component("optimizer state", n * b * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments in param dtype: {_n(n)}·{ADAMW_STATES}·{b} B")
    else:
        state = Component("optimizer state", math.ceil(n * ADAMW_8BIT_BYTES_PER_PARAM), "always",
                          f"8-bit AdamW: {_n(n)}·{ADAMW_8BIT_BYTES_PER_PARAM:.3f} B")
    sb = MASTER_WEIGHT_BYTES if master else b
    cast = largest * MASTER_WEIGHT_BYTES if master else 0  # one tensor's float32 gradient while it steps
    if x.device == "cpu" and x.optimizer == "adamw":
        temp = CPU_ADAMW_STEP_TEMPORARIES * largest * sb + cast
        step = Component("optimizer step workspace", temp, "update",
                         f"per-tensor AdamW temporaries: {CPU_ADAMW_STEP_TEMPORARIES}·{_n(largest)}·{sb} B"
                         + (f" + its float32 gradient, {_n(largest)}·{MASTER_WEIGHT_BYTES} B" if master else ""))
    elif master:
        step = Component("optimizer step workspace", cast, "update",
                         f"fused AdamW on the master copy: one tensor's float32 gradient, "
                         f"{_n(largest)}·{MASTER_WEIGHT_BYTES} B")
    else:
        step = Component("optimizer step workspace", 0, "update",
                         "fused AdamW (cuda) / blockwise 8-bit kernels: no temporaries")
    micro_batches = -(-x.rows // x.micro_rows)
    accumulate = GRAD_ACCUMULATION_TEMPORARIES * largest * b if micro_batches > 1 else 0
    acc = Component("gradient accumulation", accumulate, "update",
                    f"{micro_batches} micro-batches: the next gradient of the largest trainable tensor before it is "
                    f"added, {GRAD_ACCUMULATION_TEMPORARIES}·{_n(largest)}·{b} B" if accumulate else
                    "one micro-batch per step: gradients are written once")
    out = [grads, acc, state, step]
    if master:
        out.append(Component("fp32 master weights", n * MASTER_WEIGHT_BYTES, "always",
                             f"memory.bf16_update: a float32 copy of each trained bf16 weight, "
                             f"N·{MASTER_WEIGHT_BYTES} B = {_n(n)}·{MASTER_WEIGHT_BYTES}"))
    return out


def shared_prompt_groups(x: PlanInputs, shape: ModelShape) -> int:
    """Prompt groups in the largest update micro-batch when each group's prompt runs once
    (memory.share_prompt_forward), else 0: sharing needs >= 2 rows of one prompt in a micro-batch and
    no gradient checkpointing (loss/shared_prompt.shares_work), and is only used where it keeps fewer
    bytes than the plain update (``shared_prompt_saves``). Micro-batches cut the rows in order, so m rows
    span ceil(m / G) groups, one more when neither of m and G divides the other."""
    m, G = x.micro_rows, x.num_generations
    if not x.share_prompt_forward or x.gradient_checkpointing or m < 2 or G < 2:
        return 0
    aligned = G % m == 0 or m % G == 0
    groups = min(m, -(-m // G) + (0 if aligned else 1))
    return groups if shared_prompt_saves(x, groups, shape) else 0


def shared_prompt_saves(x: PlanInputs, groups: int, shape: ModelShape, prompt_padded: bool | None = None) -> bool:
    """Whether running ``groups`` prompts once keeps fewer bytes per layer than the plain update.

    The completion pass attends T queries to P + T keys through a [m, 1, T, S] mask (and sdpa then
    repeats keys and values to query width), so with long completions after a short prompt sharing
    costs more than it saves; the update asks this before it shares (plan/prompt_sharing.py)."""
    if groups < 1 or groups >= x.micro_rows:
        return False
    shared = update_layer_bytes(shape, x, groups=groups, prompt_padded=prompt_padded)[0]
    return shared < update_layer_bytes(shape, x, groups=0)[0]


def no_grad_pass_bytes(shape: ModelShape, x: PlanInputs, groups: int, prompt_padded: bool | None = None) -> int:
    """What a pass without gradients (reference / old-policy log-probs) holds at its peak for the largest
    micro-batch: one layer's forward working set, plus, shared (``groups`` > 0), the S² mask terms of the
    completion pass ([m, 1, T, S] bool and its compute-dtype copy inside sdpa) and the KV cache of every
    layer that the fanned-out prompt leaves (m·S·2·kv·B per layer). Plain (``groups`` = 0): m·S unpadded
    tokens through one layer, no mask, no cache. Nothing is kept for backward, but the mask is alive
    for every layer: W-long 8 x (512 + 8,192) on W-cpu's shape holds 2.8 GiB shared, 0.5 GiB plain."""
    m, P, T, S = x.micro_rows, x.max_prompt_length, x.max_completion_length, x.seq_len
    plain_x = dataclasses.replace(x, padding_mask=False)
    if not groups:
        return inference_bytes_per_token_layer(shape, plain_x) * m * S
    if prompt_padded is None:
        prompt_padded = x.padding_mask and x.prompts_per_step > 1
    masked_x = dataclasses.replace(x, padding_mask=True)
    p_shared, p_quad = attention_mask_bytes(x, groups, P, padded=prompt_padded, shape=shape)
    c_shared, c_quad = attention_mask_bytes(x, m, S, padded=True, shape=shape, pairs=m * T * S)
    work = max(inference_bytes_per_token_layer(shape, masked_x if prompt_padded else plain_x) * groups * P
               + p_shared + p_quad,
               inference_bytes_per_token_layer(shape, masked_x) * m * T + c_shared + c_quad)
    cache = shape.layers * m * S * 2 * shape.kv_dim * _compute_bytes(x)
    return work + cache


def shared_prompt_lighter_without_grad(shape: ModelShape, x: PlanInputs, groups: int,
                                       prompt_padded: bool | None = None) -> bool:
    """Whether a pass without gradients may share ``groups`` prompts: it saves work, and it must not hold
    more at its peak than the plain pass (``no_grad_pass_bytes``). Long completions after a short prompt
    fail this (the completion pass's mask outgrows the prompt tokens saved): that pass, run before the
    update, set W-long 8 x 8K's peak at 3.5 GiB against a 1.9 GiB plan (issue 43)."""
    if groups < 1 or groups >= x.micro_rows:
        return False
    return no_grad_pass_bytes(shape, x, groups, prompt_padded) <= no_grad_pass_bytes(shape, x, 0)


def update_layer_bytes(shape: ModelShape, x: PlanInputs, groups: int | None = None,
                       prompt_padded: bool | None = None) -> tuple[int, int, int, str]:
    """One decoder layer's saved bytes for the largest micro-batch, the tokens it runs, the S² bytes
    shared by all layers (a bool mask) and a description.

    Plain update: m unpadded rows of S tokens, no mask (a·m·S + the kernel's S² terms of m·S² pairs).
    Shared prompt (g groups): the prompt pass runs g·P tokens (padded when the step's prompts differ:
    prompts_per_step > 1); the completion pass runs m·T tokens against each row's P + T keys and values
    with a [m, 1, T, S] mask, so it has the masked kernel's behaviour (sdpa repeats keys and values to
    query width) over m·T·S (query, key) pairs, plus the fanned-out prompt keys/values m·P·2·kv'·B.
    ``groups`` / ``prompt_padded`` override what the inputs imply (0 groups = the plain update).
    """
    B, S, P, T, m = _compute_bytes(x), x.seq_len, x.max_prompt_length, x.max_completion_length, x.micro_rows
    kname = attn_kernels.kernel(x.attn_implementation)[0]
    groups = shared_prompt_groups(x, shape) if groups is None else groups
    if not groups:
        shared, quad = attention_mask_bytes(x, m, S, padded=False, shape=shape)
        a = activation_bytes_per_token_layer(shape, x, tokens=m * S)
        per_layer = a * m * S + quad
        what = f"a = {_n(a)} B/token/layer{' (MLP tiled)' if _tiles(shape, x, m * S) else ''}, m·S = {m}·{_n(S)}, " \
               "unpadded rows"
        return per_layer, m * S, shared, what + (", S² terms of eager" if quad else "")
    prompt_layer, p_shared, a_prompt = _prompt_pass_layer_bytes(shape, x, groups, prompt_padded)
    c_shared, c_quad = attention_mask_bytes(x, m, S, padded=True, shape=shape, pairs=m * T * S)
    a_comp = activation_bytes_per_token_layer(shape, x, padded=True, tokens=m * T)
    fan_out = m * P * 2 * attn_kernels.kv_width(shape, kname, True, x.device) * B
    per_layer = prompt_layer + a_comp * m * T + fan_out + c_quad
    what = (f"shared prompt: g·P = {groups}·{_n(P)} prompt tokens (a = {_n(a_prompt)}), m·T = {m}·{_n(T)} "
            f"completion tokens (a = {_n(a_comp)}) + prompt keys/values m·P·2·kv'·B + mask terms")
    return per_layer, groups * P + m * T, max(p_shared, c_shared), what


def _prompt_pass_layer_bytes(shape: ModelShape, x: PlanInputs, groups: int,
                             prompt_padded: bool | None = None) -> tuple[int, int, int]:
    """The shared-prompt layout's prompt pass, one decoder layer: (saved bytes of its g·P tokens with their S²
    terms, the mask bytes shared by the layers, bytes per token)."""
    P = x.max_prompt_length
    if prompt_padded is None:
        prompt_padded = x.padding_mask and x.prompts_per_step > 1
    p_shared, p_quad = attention_mask_bytes(x, groups, P, padded=prompt_padded, shape=shape)
    a_prompt = activation_bytes_per_token_layer(shape, x, padded=prompt_padded, tokens=groups * P)
    return a_prompt * groups * P + p_quad, p_shared, a_prompt


def _offloads_to_host(x: PlanInputs) -> bool:
    """memory.offload_activations on CUDA (it needs checkpointing): the checkpoints and the final norm's saved
    tensors wait in host memory (update/offload.py); on CPU offloading changes nothing."""
    return x.offload_activations and x.device == "cuda"


def _activation_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    B = _compute_bytes(x)
    L, H = shape.layers, shape.hidden
    layer_bytes, tokens, mask_shared, what = update_layer_bytes(shape, x)
    final_norm = tokens * ((4 + 2 * B) * H + 4)
    on_host = _offloads_to_host(x)
    kname = attn_kernels.kernel(x.attn_implementation)[0]
    what = f"{what}, {kname}"
    # Backward's workspace beside the layer it is in: a share of that layer's activations, or an RMSNorm's
    # fp32 backward where the layer keeps little (formulas.norm_backward_bytes_per_token)
    norm_ws = norm_backward_bytes_per_token(shape, x, tokens) * tokens
    workspace = max(math.ceil(BACKWARD_WORKSPACE_LAYERS * layer_bytes), norm_ws)
    ws_what = (f"max({BACKWARD_WORKSPACE_LAYERS:g}·(one layer), tokens·((4·{NORM_BACKWARD_FP32_TENSORS} + "
               f"B·{NORM_BACKWARD_RESIDUAL_GRADS})·H - MLP's saved bytes) at the norm's backward)")
    out: list[Component] = []
    if not x.gradient_checkpointing:
        out.append(Component("activations", L * layer_bytes + final_norm, "update",
                             f"L·(one layer) + final norm tokens·(4+2B)·H; {what}"))
        out.append(Component("backward workspace", workspace, "update", f"{ws_what}; {what}"))
    else:
        inputs_per_layer = tokens * H * B
        resident = min(OFFLOAD_RESIDENT_LAYERS, L) if on_host else L
        kind = "offloaded" if on_host else "checkpointed"
        if on_host:  # the final norm's saved tensors are offloaded with the checkpoints (update/offload.py)
            out.append(Component("activations", resident * inputs_per_layer, "update",
                                 f"{kind} layer inputs {resident}·m·S·H·B on the device; {what}"))
        else:
            out.append(Component("activations", resident * inputs_per_layer + final_norm, "update",
                                 f"{kind} layer inputs {resident}·m·S·H·B + final norm m·S·(4+2B)·H; {what}"))
        out.append(Component("recompute working set",
                             math.ceil(CHECKPOINT_RECOMPUTE_LAYERS * layer_bytes) + workspace, "update",
                             f"backward re-runs one layer: {CHECKPOINT_RECOMPUTE_LAYERS:g}·(one layer) + "
                             f"{ws_what}; {what}"))
        if on_host:  # what offload.py moves, into exact-size pinned buffers (formulas.offloaded_bytes)
            host_bytes, host_what = offloaded_bytes(shape, x, tokens)
            out.append(Component("offloaded checkpoints", host_bytes, "update", host_what, location="host"))
    out.append(Component("attention mask", mask_shared, "update",
                         f"S² mask shared by the layers: {_n(mask_shared)} B" if mask_shared else
                         f"unpadded rows, {kname} causal kernel: no mask"))
    # A tiled MLP's shard runs backward at another moment of the layer's backward than the norm's workspace:
    # only what exceeds that workspace adds to the peak.
    out.extend(_after_freed(_tiled_mlp_components(shape, x), "tiled MLP shard", workspace,
                            "the layer's backward workspace (alive at another moment)"))
    return out


def _tiled_mlp_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    """With the tiled MLP, backward re-runs one shard of the largest MLP call at a time: that shard's MLP
    intermediates plus their gradients, (R + W)·k·(MLP bytes per token), k = ceil(N / ceil(N / H)); beside them
    TILED_MLP_BACKWARD_BUFFERS H-wide gradient tensors of the whole call, N·H·B each."""
    groups = shared_prompt_groups(x, shape)
    m, P, T = x.micro_rows, x.max_prompt_length, x.max_completion_length
    calls = (groups * P, m * T) if groups else (m * x.seq_len,)
    largest = max(calls)
    if not _tiles(shape, x, largest):
        return []
    k = tiled_shard_tokens(largest, shape.hidden)
    work = CHECKPOINT_RECOMPUTE_LAYERS + BACKWARD_WORKSPACE_LAYERS
    per_token = mlp_bytes_per_token(shape, x)
    buffers = TILED_MLP_BACKWARD_BUFFERS * largest * shape.hidden * _compute_bytes(x)
    return [Component("tiled MLP shard", math.ceil(work * k * per_token) + buffers, "update",
                      f"backward re-runs one MLP shard: {work:g}·k·(MLP bytes per token), k = ceil(N / ceil(N/H)) = "
                      f"{_n(k)} of N = {_n(largest)} tokens, {_n(per_token)} B/token; + {TILED_MLP_BACKWARD_BUFFERS}"
                      f"·N·H·B gradient buffers of the whole call")]


def _loss_component(shape: ModelShape, x: PlanInputs) -> Component:
    B = _compute_bytes(x)
    m = x.micro_rows
    T, V, H = x.max_completion_length, shape.vocab, shape.hidden
    per_token = LOSS_PER_TOKEN_TENSORS * m * T * 4
    if not x.chunked_loss:
        b = logits_bytes(m, T, V, B, FULL_LOGITS_COPIES) + per_token
        return Component("loss working set", b, "update",
                         f"full logits: {FULL_LOGITS_COPIES}·m·T·V·B = {FULL_LOGITS_COPIES}·{m}·{_n(T)}·{_n(V)}·{B}"
                         f" + {LOSS_PER_TOKEN_TENSORS}·m·T·4")
    chunk = min(x.token_chunk, m * T)
    vc = min(x.vocab_chunk or V, V)
    blocks, path = loss_blocks(x, vc == V)
    # A trained head (full fine-tuning) accumulates its gradient over the chunks in fp32; in a 16-bit dtype its
    # per-slice product is formed in that dtype and widened (chunked_head._backprop_slice).
    head_grad = 0 if x.lora else V * H * 4 + (0 if B == 4 else vc * H * (B + 4))
    hidden = m * T * H * (4 + B) + LOSS_CHUNK_HIDDEN_TEMPORARIES * chunk * H * 4
    b = math.ceil(logits_bytes(chunk, vc, 1, 4, blocks)) + hidden + head_grad + per_token
    product = "" if B == 4 else f" + slice·H·({B}+4) (its per-slice product)"
    head = f" + V·H·4 (fp32 head-grad accumulator){product}" if head_grad else ""
    return Component("loss working set", b, "update",
                     f"chunked, {path}: {blocks:g}·{_n(chunk)} tokens·{_n(vc)} vocab·4 B + m·T·H·(4+{B}) (hidden "
                     f"grad, gathered hidden) + {LOSS_CHUNK_HIDDEN_TEMPORARIES}·{_n(chunk)}·H·4 (per-chunk "
                     f"temporaries){head} + {LOSS_PER_TOKEN_TENSORS}·m·T·4")


def loss_blocks(x: PlanInputs, one_slice: bool) -> tuple[float, str]:
    """fp32 ``[chunk, vocabulary slice]`` blocks the chunked head holds at once, and the path's name (formulas:
    LOSS_BLOCKS_*): a 16-bit compute dtype adds half a block (the head output in that dtype)."""
    if x.fused_loss:
        blocks, path = LOSS_BLOCKS_FUSED, "fused head + loss"
    else:
        extra = x.entropy_bonus or (x.lora and one_slice)  # backward's softmax / the frozen head's dlogp/dh pass
        blocks, path = LOSS_BLOCKS_SEPARATE + (LOSS_BLOCKS_SEPARATE_EXTRA if extra else 0), "log-probs then loss"
    return blocks + (0.0 if _compute_bytes(x) == 4 else 0.5), path


def _loss_kept_after(shape: ModelShape, x: PlanInputs) -> int:
    """Of the chunked loss line, what outlives the LM head's backward: the hidden-state gradient (m·T·H·4) and
    a trained head's fp32 gradient accumulator (V·H·4). The full-logits path frees its logits."""
    if not x.chunked_loss:
        return 0
    return x.micro_rows * x.max_completion_length * shape.hidden * 4 + (0 if x.lora else shape.vocab * shape.hidden * 4)


def _buffer_components(x: PlanInputs) -> list[Component]:
    rows, T, P, groups = x.rows, x.max_completion_length, x.max_prompt_length, x.prompts_per_step
    S = x.seq_len
    rollout = rows * T * (8 + 1 + 4) + groups * P * (8 + 1) + rows * S * (8 + 1)
    old = x.num_iterations > 1 or x.ppo
    n_logp = int(x.needs_reference) + int(old)
    which = " + ".join(w for w, on in (("ref", x.needs_reference), ("old", old)) if on) or "none"
    return [
        Component("rollout buffers", rollout, "always",
                  "ids/mask/sampler log-probs rows·T·13 B + prompts groups·P·9 B + update inputs rows·S·9 B"),
        Component("log-prob buffers", n_logp * rows * T * 4, "always", f"[rows, T] fp32 ({which}): {n_logp}·{rows}·{T}·4"),
    ]


def decode_packing(shape: ModelShape, x: PlanInputs) -> str:
    """``x.decode_packing`` resolved: ``auto`` packs every projection for CPU float32 decoding ("all",
    ~1.5x decode throughput on SmolLM2) unless the projections are small (under ``generation.DECODE_PACK_MIN_BYTES``:
    oneDNN's cache of one kernel per weight shape and batch width then outweighs them) or packing raises
    the peak (the generation phase with the packed copies outgrows the update phase); then the LM head
    only ("head")."""
    if x.decode_packing != "auto":
        return x.decode_packing
    if x.device != "cpu" or x.param_dtype_bytes != 4:
        return "all"
    if small_projections(shape):
        return "head"
    all_plan = plan_memory(shape, dataclasses.replace(x, decode_packing="all"))
    head_plan = plan_memory(shape, dataclasses.replace(x, decode_packing="head"))
    return "all" if all_plan.peak_bytes <= head_plan.peak_bytes else "head"


def _notes(shape: ModelShape, x: PlanInputs) -> list[str]:
    notes = []
    unknown = attn_kernels.kernel(x.attn_implementation)[1]
    if unknown:
        notes.append(unknown)
    if shape.max_positions and x.seq_len > shape.max_positions:
        notes.append(f"prompt + completion = {x.seq_len:,} tokens exceeds the model's position limit "
                     f"({shape.max_positions:,}, after rope scaling): `slimgrpo plan` and `train` refuse it")
    if x.offload_activations and x.device == "cpu":
        notes.append("offload_activations has no effect on cpu: host memory is the device; checkpoints stay in RSS")
    if x.micro_batch_rows > x.rows:
        notes.append(f"micro_batch_rows ({x.micro_batch_rows}) > rows per step ({x.rows}); using {x.rows}")
    return notes


def _after_freed(components: list[Component], name: str, freed: int, what: str) -> list[Component]:
    """The line ``name`` is only alive after ``freed`` bytes (``what``) were released, so it holds only
    what exceeds them: max(0, its bytes - freed). The other lines are returned unchanged."""
    out = []
    for c in components:
        if c.name == name and c.bytes:
            c = Component(c.name, max(0, c.bytes - freed), c.phase,
                          f"{c.formula} = {_n(c.bytes)}, after {what} ({_n(freed)}) is freed: max(0, difference)")
        out.append(c)
    return out


def _overlap_recompute(activations: list[Component], loss: Component, final_norm: int, offloaded: bool,
                       kept_after_loss: int, final_norm_backward: int) -> list[Component]:
    """The LM head and loss run (and free their chunks), and the final norm runs backward (freeing what it
    saved), before backward reaches the decoder, where each layer's backward holds its workspace (and, with
    checkpointing, the layer recomputed): these working sets are alive one after the other. So the recompute
    line only holds what exceeds the loss working set plus the final norm's saved tensors (the trace showed the
    final-norm part: docs/benchmarks.md#trace-check). ``offloaded``: those saved tensors wait in host memory, so
    freeing them frees nothing on the device. ``kept_after_loss``: the part of the loss line still alive after
    the LM head's backward (:func:`_loss_kept_after`).

    Without checkpointing the backward workspace line holds the larger of two moments after the loss's chunks
    are freed, beyond those chunks: the final norm's own backward (``final_norm_backward``, its fp32
    temporaries, while every saved tensor is still alive) and a layer's (its workspace, after the final norm's
    saved tensors are freed). Traced on W-long 8 x 8K (docs/benchmarks.md#plan-vs-measured): the peak is the
    final norm's backward, the loss's chunks gone, the head's fp32 gradient and the hidden-state gradient
    alive."""
    freed, what = loss.bytes + final_norm, "the loss working set and the final norm's saved tensors"
    if offloaded:
        freed, what = loss.bytes, "the loss working set"
    out = _after_freed(activations, "recompute working set", freed, what)
    chunks = loss.bytes - kept_after_loss
    lines = []
    for c in out:
        if c.name == "backward workspace" and c.bytes:
            at_layers = max(0, c.bytes - final_norm)
            moment = max(final_norm_backward, at_layers)
            c = Component(c.name, max(0, moment - chunks), c.phase,
                          f"{c.formula} = {_n(c.bytes)}; its moments: the final norm's backward, "
                          f"{NORM_BACKWARD_FP32_TENSORS}·tokens·H·4 fp32 = {_n(final_norm_backward)}, a layer's, "
                          f"after the final norm's saved tensors ({_n(final_norm)}) are freed = {_n(at_layers)}; "
                          f"the larger, beyond the loss's chunks and per-token tensors ({_n(chunks)}), freed "
                          f"before both: max(0, difference)")
        lines.append(c)
    return lines


def _overlap_reference_stream(weights: list[Component], update: list[Component]) -> list[Component]:
    """The streamed reference's device working set is alive during the reference pass, before the update's
    gradients and activations exist (they are freed at the end of every step): only what exceeds them adds."""
    held = sum(c.bytes for c in update if c.location == "device" and c.phase == "update")
    return _after_freed(weights, "reference stream", held, "the update's gradients and activations")


def _tokenizer_component(shape: ModelShape, x: PlanInputs) -> list[Component]:
    """CPU: the tokenizer's objects count in the process's RSS (formulas.TOKENIZER_BYTES_PER_VOCAB, measured);
    on CUDA they are host memory beside the device. Not a tensor: ``MemoryPlan.framework_bytes`` holds it."""
    if x.device != "cpu" or x.framework_overhead_bytes is not None:
        return []
    return [Component("tokenizer", tokenizer_bytes(shape.vocab), "always",
                      f"the run's tokenizer (vocabulary and merges, not tensors), V·{TOKENIZER_BYTES_PER_VOCAB:,} B = "
                      f"{_n(shape.vocab)}·{TOKENIZER_BYTES_PER_VOCAB:,} (measured retained RSS, about 1 KB an entry)")]


def _gradients_in_backward(shape: ModelShape, x: PlanInputs, optimizer: list[Component],
                           backward: list[Component]) -> list[Component]:
    """One micro-batch per optimizer step (every ``.grad`` is None before it, update/updater.py): the gradients
    line holds what the update's moments need of it beside ``backward``'s lines (activations, loss: ``held``),
    the largest of three (checked against a walk down the layers and the trace, tests/plan/test_plan_gradients.py):

    - backward's peak in the decoder: a layer's gradients (``g`` bytes) are written as its saved tensors (``a``)
      are freed, going down from the last layer, so the live sum peaks at the first layer (g ≤ a) or the last
      (g > a): ``g + max(0, (L - 1)·(g - a))`` plus the final norm's; a trained head's gradient is the loss
      line's fp32 accumulator. With a shared prompt only the completion pass's part of ``a`` is freed there:
      the prompt pass keeps its saved tensors until its own backward, after the completions'.
    - the embedding's backward (full fine-tuning): every gradient exists, and a tied embedding's dense gradient
      is summed with the head's, two more ``V·H·b`` alive at once; with a shared prompt the prompt pass's saved
      tensors are still alive then (the completions reach the embedding first), and an untied embedding gets a
      second dense gradient from the prompt pass's own lookup.
    - the optimizer step: every gradient and the step's temporaries, the activations and the loss freed.

    Not under DDP (its buckets hold every gradient), FSDP2 (sharded, plan/sharding.py) or gradient accumulation
    (earlier micro-batches' gradients are whole): the whole line there."""
    grads = next(c for c in optimizer if c.name == "gradients")
    micro_batches = -(-x.rows // x.micro_rows)
    if x.ddp or x.fsdp_shards > 1 or micro_batches > 1 or not grads.bytes:
        return optimizer
    n, b, _ = _trainable(shape, x)
    L, VH = shape.layers, shape.embedding_params
    g = (n // L if x.lora else shape.layer_params) * b
    layer_bytes, tokens = update_layer_bytes(shape, x)[:2]
    groups = shared_prompt_groups(x, shape)
    prompt_layer = _prompt_pass_layer_bytes(shape, x, groups)[0] if groups else 0
    if not x.gradient_checkpointing:
        a = layer_bytes - prompt_layer
    else:  # the layer's checkpointed input goes with it; offloaded ones were never on the device
        a = 0 if _offloads_to_host(x) else tokens * shape.hidden * _compute_bytes(x)
    live = min(grads.bytes, g + max(0, (L - 1) * (g - a)) + (0 if x.lora else shape.hidden * b))
    held = sum(c.bytes for c in backward if c.location == "device")
    temp = next(c.bytes for c in optimizer if c.name == "optimizer step workspace")
    step_line = max(0, temp - held)  # what _overlap_step_workspace leaves the step workspace line
    at_step = grads.bytes + temp - held - step_line
    at_embedding = 0
    if not x.lora:
        tied_sum = 2 * VH * b if shape.tie else 0
        second_lookup = VH * b if groups and not shape.tie else 0
        at_embedding = max(grads.bytes + tied_sum + L * prompt_layer, grads.bytes + second_lookup) - held
        at_embedding -= step_line
    need = max(live, at_step, at_embedding)
    if need == live:
        what = (f"at backward's peak, one micro-batch: each layer's g = {_n(g)} B written as its a = {_n(a)} B "
                "are freed, g + max(0, (L-1)·(g - a)) + final norm")
    elif need == at_embedding:
        tied = " + the tied head and embedding gradients summed, 2·V·H·b" if shape.tie else ""
        kept = f" + the prompt pass's saved tensors, L·{_n(prompt_layer)}" if groups else ""
        what = (f"at the embedding's backward, every gradient{tied}{kept}, less backward's activations + loss "
                f"({_n(held)})")
    else:
        what = (f"at the optimizer step, after backward's activations + loss ({_n(held)}) are freed (one micro-"
                f"batch: at backward's peak only {_n(live)} exist)")
    line = Component("gradients", need, "update", f"{grads.formula} in all; {what}")
    return [line if c is grads else c for c in optimizer]


def _overlap_step_workspace(optimizer: list[Component], backward: list[Component]) -> list[Component]:
    """The optimizer step runs after backward has freed activations and the loss working set, so its
    temporaries only add what exceeds them: the step workspace line holds max(0, temporaries - those)."""
    held = sum(c.bytes for c in backward if c.location == "device")
    return _after_freed(optimizer, "optimizer step workspace", held, "backward's activations + loss")


def tiled_mlp_on(shape: ModelShape, inputs: PlanInputs) -> bool:
    """Whether the run tiles its MLPs: ``on`` / ``off`` as set; ``auto`` when one update micro-batch runs at
    least TILED_MLP_AUTO_TOKENS tokens (m·S) through each MLP and the tiled plan's peak is lower than the
    untiled one's by at least TILED_MLP_MIN_GAIN of it (the MLP's intermediates are a peak)."""
    if inputs.tiled_mlp != "auto":
        return inputs.tiled_mlp == "on"
    if inputs.micro_rows * inputs.seq_len < TILED_MLP_AUTO_TOKENS:
        return False
    off = plan_memory(shape, dataclasses.replace(inputs, tiled_mlp="off")).peak_bytes
    on = plan_memory(shape, dataclasses.replace(inputs, tiled_mlp="on")).peak_bytes
    return on <= off * (1 - TILED_MLP_MIN_GAIN)


# ----------------------------------------------------------------------------------------------
# The planner
# ----------------------------------------------------------------------------------------------
def plan_memory(shape: ModelShape, inputs: PlanInputs) -> MemoryPlan:
    """Bytes per component and the peak: always + max(generation, update).

    Pure: no torch, no file access; the same inputs always give the same plan.
    On cuda, components marked location="host" (offloaded checkpoints, the full-fine-tuning
    reference copy) go to ``host_bytes`` and not to the peak. On cpu everything counts in the peak
    (process RSS), which also holds the measured import footprint.
    """
    x = inputs
    if x.tiled_mlp == "auto":  # resolved here; the plan keeps the inputs as given
        x = dataclasses.replace(x, tiled_mlp="on" if tiled_mlp_on(shape, x) else "off")
    if x.decode_packing == "auto":
        x = dataclasses.replace(x, decode_packing=decode_packing(shape, x))
    overhead = x.framework_overhead_bytes
    if overhead is None:
        overhead = CUDA_FRAMEWORK_OVERHEAD_BYTES if x.device == "cuda" else CPU_FRAMEWORK_OVERHEAD_BYTES
        what = "CUDA context and workspaces" if x.device == "cuda" else "measured import RSS of torch+transformers"
    else:
        what = "given by framework_overhead_bytes"
    loss = _loss_component(shape, x)
    tokens = update_layer_bytes(shape, x)[1]
    final_norm = tokens * ((4 + 2 * _compute_bytes(x)) * shape.hidden + 4)
    kept = _loss_kept_after(shape, x)
    final_norm_backward = 4 * NORM_BACKWARD_FP32_TENSORS * shape.hidden * tokens
    activations = _overlap_recompute(_activation_components(shape, x), loss, final_norm, _offloads_to_host(x), kept,
                                     final_norm_backward)
    optimizer = _gradients_in_backward(shape, x, _optimizer_components(shape, x), activations + [loss])
    optimizer = _overlap_step_workspace(optimizer, activations + [loss])
    weights = _overlap_reference_stream(_weight_components(shape, x), optimizer + activations + [loss])
    components = shard_components(shape, x, [
        *weights,
        *optimizer,
        *activations,
        loss,
        *_buffer_components(x),
        *critic_components(shape, x),
        *(vllm_components(shape, x) if x.rollout_engine == "vllm" else generation_components(shape, x)),
        Component("framework overhead", overhead, "always", what),
        *_tokenizer_component(shape, x),
    ])
    device = [c for c in components if c.location == "device"]
    totals = {p: sum(c.bytes for c in device if c.phase == p) for p in PHASES}
    peak_phase = "generation" if totals["generation"] > totals["update"] else "update"
    peak = totals["always"] + totals[peak_phase]
    host = sum(c.bytes for c in components if c.location == "host")
    notes = _notes(shape, x)
    start = vllm_start_note(x, totals["always"])
    if start:
        notes.append(start)
    if inputs.decode_packing == "auto" and x.decode_packing == "head" and x.device == "cpu" \
            and not small_projections(shape):
        notes.append("decode weights: the LM head only is packed for decoding (packing every projection, ~1.5x "
                     "faster decoding, would raise this plan's peak: generation sets it)")
    if inputs.tiled_mlp == "auto" and x.tiled_mlp == "on":
        notes.append(f"memory.tiled_mlp=auto: on (m·S = {_n(x.micro_rows * x.seq_len)} tokens per MLP call, at least "
                     f"{_n(TILED_MLP_AUTO_TOKENS)}, and it lowers the peak)")
    return MemoryPlan(shape=shape, inputs=inputs, components=components, peak_bytes=peak,
                      peak_phase=peak_phase, host_bytes=host, notes=notes)
