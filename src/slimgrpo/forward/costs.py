"""What a decoder forward keeps and holds, per token and layer: the cost rules of the layouts in this room.

- ``activation_bytes_per_token_layer``: what autograd keeps for backward (and ``mlp_bytes_per_token``, the MLP's
  share, which a tiled MLP keeps per shard instead; ``norm_backward_bytes_per_token``, the RMSNorm backward's
  workspace);
- ``inference_bytes_per_token_layer``: a forward without autograd (the rollout's prefill, old / reference
  log-probs);
- ``attention_mask_bytes``: what grows with S² (a padding mask and sdpa's copy of it, eager's scores);
- ``update_layer_bytes``: one layer's saved bytes for the update's largest micro-batch in its layout (unpadded
  rows, or each group's prompt once), and the shared-prompt verdicts the layout choice asks
  (``shared_prompt_saves`` with gradients, ``shared_prompt_lighter_without_grad`` without: ``layout.py``).

The planner adds these up (``plan/model.py``, ``update/costs.py``); the derivations are in docs/memory.md.
Symbols as in ``runspec/cost.py``.
"""

from __future__ import annotations

import dataclasses

from slimgrpo.families import FAMILIES
from slimgrpo.memory import attention as attn_kernels
from slimgrpo.runspec.cost import lora_targets, num
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape

# A decoder layer's RMSNorm runs backward through its decomposed fp32 ops (upcast, square, mean, rsqrt, scale):
# up to this many fp32 H-wide gradient temporaries are alive at once, beside this many compute-dtype H-wide
# gradients of the residual stream (traced on Qwen3-8B / Llama-3.1-8B widths, LoRA, bf16). Where a layer's
# activations are small (LoRA with the MLP tiled) this, not BACKWARD_WORKSPACE_LAYERS of a layer, is the
# workspace beside the recomputed layer.
NORM_BACKWARD_FP32_TENSORS = 5
NORM_BACKWARD_RESIDUAL_GRADS = 3


def activation_bytes_per_token_layer(shape: ModelShape, inputs: RunSpec, padded: bool = False,
                                     tokens: int | None = None) -> int:
    """Bytes autograd keeps per token and per decoder layer without checkpointing (mask excluded).

    A tensor is kept only if a backward formula needs it, and a matmul with a frozen weight does
    not keep its input. With B the compute bytes, kv' = q when the kernel
    repeats keys/values to query width (eager; sdpa with a mask, ``padded``, except on CPU), else kv
    (the update's unpadded rows under sdpa / flash_attention_2; sdpa on CPU: ``attention.native_gqa``):

        RMSNorm ×2      4·H + 4        fp32 upcast and rsqrt, kept for the variance backward
        q/k RMSNorm     4·(q + kv) + 4·(heads + kv_heads)   Qwen3 (``qk_norm``): the same per head of q and k;
                        + B·(q + kv)   full fine-tuning: the normalised q / k for the norm weights' gradient
        normed input    2·B·H          full fine-tuning: normalised x (norm-weight grad) and the
                                       weighted output (projection-weight grads)
                        B·H             LoRA: the adapters' input, one tensor shared by the projections
                                       that read it (adapters compute in the input's dtype:
                                       modeling.InputDtypeLinear; none of peft's fp32 input copies)
        attention       B·(2·q + 2·kv') + 4·heads    SDPA keeps q, k, v, output and fp32 logsumexp;
                                       o_proj's input (and its adapter's) is SDPA's output (same
                                       storage)
        MLP             3·B·I          SiLU input, SiLU output, up output
        down_proj input B·I            full fine-tuning, or a LoRA adapter on down_proj
        LoRA            B·r per adapted projection (lora_A output, kept by lora_B)

    Not counted: each adapter's weight cast to the compute dtype (r·(in + out)·B per projection and call,
    not per token; 0.08 GiB for all of Qwen3-8B's rank-16 adapters when nothing is checkpointed).

    Tiled MLP (``inputs.tiled_mlp == "on"`` and a call of ``tokens`` > H tokens): the MLP's part
    (:func:`mlp_bytes_per_token`) is not kept; the tiler keeps the MLP's input instead, which full
    fine-tuning keeps anyway (the weighted norm output above) and LoRA adds (B·H).

    Checked tensor by tensor against saved_tensors_hooks on Qwen2 layers (fp32/bf16, full/LoRA).
    """
    H, I, q = shape.hidden, shape.intermediate, shape.q_dim
    B = inputs.compute_bytes
    adapted = set(lora_targets(inputs.lora_target_modules)) if inputs.lora else set()

    def lora_input(width: int, consumers: tuple[str, ...]) -> int:
        return width * B if any(m in adapted for m in consumers) else 0

    kv_saved = attn_kernels.kv_width(shape, attn_kernels.kernel(inputs.attn_implementation)[0], padded,
                                     inputs.device)
    norms = 2 * (4 * H + 4)
    if FAMILIES[shape.family]["qk_norm"]:
        kv = shape.kv_dim
        norms += 4 * (q + kv) + 4 * (shape.heads + shape.kv_heads) + (0 if inputs.lora else B * (q + kv))
    attention = B * (2 * q + 2 * kv_saved) + 4 * shape.heads
    mlp = 3 * B * I
    if not inputs.lora:
        kept = 2 * (2 * B * H) + B * I
    else:
        kept = (lora_input(H, ("q_proj", "k_proj", "v_proj")) + lora_input(H, ("gate_proj", "up_proj"))
                + lora_input(I, ("down_proj",)))
    lora_mid = B * inputs.lora_rank * len(adapted)
    total = norms + attention + mlp + kept + lora_mid
    if mlp_tiled(shape, inputs, tokens):
        total += -mlp_bytes_per_token(shape, inputs) + (B * H if inputs.lora else 0)
    return total


def norm_backward_bytes_per_token(shape: ModelShape, inputs: RunSpec, tokens: int | None = None) -> int:
    """Per token, what the post-attention RMSNorm's backward adds to the layer's recomputed activations:
    NORM_BACKWARD_FP32_TENSORS fp32 H-wide temporaries and NORM_BACKWARD_RESIDUAL_GRADS H-wide gradients of the
    residual stream in the compute dtype, less the MLP's saved tensors, which its backward has freed by then
    (the MLP's share of :func:`activation_bytes_per_token_layer`; a tiled MLP's is its kept input). Can be < 0."""
    B = inputs.compute_bytes
    if mlp_tiled(shape, inputs, tokens):
        mlp = B * shape.hidden if inputs.lora else 0
    else:
        mlp = mlp_bytes_per_token(shape, inputs)
    return (4 * NORM_BACKWARD_FP32_TENSORS + B * NORM_BACKWARD_RESIDUAL_GRADS) * shape.hidden - mlp


def mlp_bytes_per_token(shape: ModelShape, inputs: RunSpec) -> int:
    """The MLP's share of :func:`activation_bytes_per_token_layer`, per token: SiLU input and output and up
    output 3·B·I, down_proj's input (B·I, full fine-tuning or a LoRA adapter on it), the adapters' shared
    input on gate / up and their lora_A outputs. What a tiled MLP keeps for one shard instead of the whole call."""
    H, I = shape.hidden, shape.intermediate
    B = inputs.compute_bytes
    if not inputs.lora:
        return 4 * B * I
    adapted = set(lora_targets(inputs.lora_target_modules))
    shared = H * B if any(m in adapted for m in ("gate_proj", "up_proj")) else 0
    down = I * B if "down_proj" in adapted else 0
    mids = B * inputs.lora_rank * sum(1 for m in ("gate_proj", "up_proj", "down_proj") if m in adapted)
    return 3 * B * I + down + shared + mids


def mlp_tiled(shape: ModelShape, x: RunSpec, tokens: int | None) -> bool:
    """The tiled MLP changes a call of ``tokens`` tokens: switched on and more than one shard."""
    return x.tiled_mlp == "on" and tokens is not None and tokens > shape.hidden


def attention_mask_bytes(inputs: RunSpec, rows: int, tokens: int, padded: bool | None = None,
                         shape: ModelShape | None = None, pairs: int | None = None) -> tuple[int, int]:
    """(shared, per_layer) bytes that grow with S² for ``rows`` sequences of ``tokens`` (or for
    ``pairs`` (query, key) positions when given: a shared-prompt update).

    With sdpa and a padding mask (``padded``, default ``inputs.padding_mask``) Hugging Face builds
    one bool [rows, 1, S, S] mask (rows·S² B); SDPA converts it to the query dtype inside every
    attention call and keeps that copy for backward (rows·S²·B per layer). The eager kernel also
    keeps [rows, heads, S, S] scores per layer (needs ``shape``). Zero for kernels without an S² tensor.
    """
    padded = inputs.padding_mask if padded is None else padded
    name = attn_kernels.kernel(inputs.attn_implementation)[0]
    if shape is None:
        if name == "eager":
            raise ValueError("attention_mask_bytes needs the model shape for the eager kernel")
        shape = ModelShape(family="llama", hidden=1, intermediate=1, layers=1, heads=1, kv_heads=1, vocab=1,
                           tie=True)
    pairs = rows * tokens * tokens if pairs is None else pairs
    shared, per_layer, _ = attn_kernels.quadratic_bytes(shape, name, pairs, inputs.compute_bytes, padded)
    return shared, per_layer


def inference_bytes_per_token_layer(shape: ModelShape, inputs: RunSpec) -> int:
    """Transient bytes per token of one layer's forward without autograd (prompt prefill).

    B·(2·H + max(2·q + 2·kv', 3·I)) + 4·H: residual and normed input, then the larger of the
    attention tensors (q, output, repeated k and v) and the MLP tensors (gate/up/product), plus
    the RMSNorm fp32 upcast.
    """
    H, I, q = shape.hidden, shape.intermediate, shape.q_dim
    B = inputs.compute_bytes
    kv_saved = attn_kernels.kv_width(shape, attn_kernels.kernel(inputs.attn_implementation)[0], inputs.padding_mask,
                                     inputs.device)
    return B * (2 * H + max(2 * q + 2 * kv_saved, 3 * I)) + 4 * H


def shared_prompt_groups(x: RunSpec, shape: ModelShape) -> int:
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


def shared_prompt_saves(x: RunSpec, groups: int, shape: ModelShape, prompt_padded: bool | None = None) -> bool:
    """Whether running ``groups`` prompts once keeps fewer bytes per layer than the plain update.

    The completion pass attends T queries to P + T keys through a [m, 1, T, S] mask (and sdpa then
    repeats keys and values to query width), so with long completions after a short prompt sharing
    costs more than it saves; the update asks this before it shares (``layout.PromptSharing``)."""
    if groups < 1 or groups >= x.micro_rows:
        return False
    shared = update_layer_bytes(shape, x, groups=groups, prompt_padded=prompt_padded)[0]
    return shared < update_layer_bytes(shape, x, groups=0)[0]


def no_grad_pass_bytes(shape: ModelShape, x: RunSpec, groups: int, prompt_padded: bool | None = None) -> int:
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
    cache = shape.layers * m * S * 2 * shape.kv_dim * x.compute_bytes
    return work + cache


def shared_prompt_lighter_without_grad(shape: ModelShape, x: RunSpec, groups: int,
                                       prompt_padded: bool | None = None) -> bool:
    """Whether a pass without gradients may share ``groups`` prompts: it saves work, and it must not hold
    more at its peak than the plain pass (``no_grad_pass_bytes``). Long completions after a short prompt
    fail this (the completion pass's mask outgrows the prompt tokens saved): that pass, run before the
    update, set W-long 8 x 8K's peak at 3.5 GiB against a 1.9 GiB plan."""
    if groups < 1 or groups >= x.micro_rows:
        return False
    return no_grad_pass_bytes(shape, x, groups, prompt_padded) <= no_grad_pass_bytes(shape, x, 0)


def update_layer_bytes(shape: ModelShape, x: RunSpec, groups: int | None = None,
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
    B, S, P, T, m = x.compute_bytes, x.seq_len, x.max_prompt_length, x.max_completion_length, x.micro_rows
    kname = attn_kernels.kernel(x.attn_implementation)[0]
    groups = shared_prompt_groups(x, shape) if groups is None else groups
    if not groups:
        shared, quad = attention_mask_bytes(x, m, S, padded=False, shape=shape)
        a = activation_bytes_per_token_layer(shape, x, tokens=m * S)
        per_layer = a * m * S + quad
        what = f"a = {num(a)} B/token/layer{' (MLP tiled)' if mlp_tiled(shape, x, m * S) else ''}, m·S = {m}·{num(S)}, " \
               "unpadded rows"
        return per_layer, m * S, shared, what + (", S² terms of eager" if quad else "")
    prompt_layer, p_shared, a_prompt = prompt_pass_layer_bytes(shape, x, groups, prompt_padded)
    c_shared, c_quad = attention_mask_bytes(x, m, S, padded=True, shape=shape, pairs=m * T * S)
    a_comp = activation_bytes_per_token_layer(shape, x, padded=True, tokens=m * T)
    fan_out = m * P * 2 * attn_kernels.kv_width(shape, kname, True, x.device) * B
    per_layer = prompt_layer + a_comp * m * T + fan_out + c_quad
    what = (f"shared prompt: g·P = {groups}·{num(P)} prompt tokens (a = {num(a_prompt)}), m·T = {m}·{num(T)} "
            f"completion tokens (a = {num(a_comp)}) + prompt keys/values m·P·2·kv'·B + mask terms")
    return per_layer, groups * P + m * T, max(p_shared, c_shared), what


def prompt_pass_layer_bytes(shape: ModelShape, x: RunSpec, groups: int,
                             prompt_padded: bool | None = None) -> tuple[int, int, int]:
    """The shared-prompt layout's prompt pass, one decoder layer: (saved bytes of its g·P tokens with their S²
    terms, the mask bytes shared by the layers, bytes per token)."""
    P = x.max_prompt_length
    if prompt_padded is None:
        prompt_padded = x.padding_mask and x.prompts_per_step > 1
    p_shared, p_quad = attention_mask_bytes(x, groups, P, padded=prompt_padded, shape=shape)
    a_prompt = activation_bytes_per_token_layer(shape, x, padded=prompt_padded, tokens=groups * P)
    return a_prompt * groups * P + p_quad, p_shared, a_prompt
