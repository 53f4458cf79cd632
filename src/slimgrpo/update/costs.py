"""What the update allocates, and in what order (``updater.py``, ``gradients.py``, ``offload.py``, ``optim.py``,
``critic.py``): the plan's lines of the update phase and of what the update keeps all run.

- what backward keeps of the forward (``activation_components``: every layer's saved tensors, or with
  checkpointing the layer inputs, on the device or offloaded to host memory, and the layer recomputed);
- the moments backward passes through, one after the other, so that a line holds only what exceeds what was
  freed before it (``overlap_recompute``: the LM head and loss, then the final norm's backward, then the
  layers'; ``gradients_in_backward``: gradients written as each layer's saved tensors are freed, the
  embedding's backward, the optimizer step; ``overlap_step_workspace``);
- gradients, optimizer state and its step's temporaries (``optimizer_components``), PPO's critic
  (``critic_components``), the step's rollout and log-prob buffers (``buffer_components``).

Change the update's order of work and these rules with it: tests/plan/test_plan_backward_overlap.py and
tests/plan/test_plan_gradients.py hold them against a naive walk and the trace. Symbols as in ``runspec/cost.py``.
"""

from __future__ import annotations

import math

from slimgrpo.forward.costs import (NORM_BACKWARD_FP32_TENSORS, NORM_BACKWARD_RESIDUAL_GRADS, mlp_bytes_per_token,
                                    mlp_tiled, norm_backward_bytes_per_token, prompt_pass_layer_bytes,
                                    shared_prompt_groups, update_layer_bytes)
from slimgrpo.memory import attention as attn_kernels
from slimgrpo.memory.tiled_mlp import tiled_shard_tokens
from slimgrpo.runspec.cost import LORA_ADAPTER_BYTES, Component, after_freed, lora_num_params, lora_targets, num
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.update.offload import OFFLOAD_MIN_BYTES

# AdamW keeps two moments (exp_avg, exp_avg_sq) created with zeros_like(param): parameter dtype.
ADAMW_STATES = 2
# 8-bit AdamW (bitsandbytes / torchao): two 1-byte states plus one fp32 absmax per 256 values.
ADAMW_8BIT_BYTES_PER_PARAM = 2 * (1 + 4 / 256)
# On CPU torch.optim.AdamW runs per tensor (no foreach): sqrt and division temporaries of the
# largest trainable tensor. On CUDA slimgrpo uses fused AdamW, which has no temporaries.
CPU_ADAMW_STEP_TEMPORARIES = 2
# bfloat16 full fine-tuning with memory.bf16_update=fp32_master (update/optim.py MasterWeightAdamW): a float32
# copy of every trained weight, float32 moments with AdamW, and one tensor's float32 gradient while it steps.
# stochastic_round (torchao) and plain keep none of these.
MASTER_WEIGHT_BYTES = 4
# From the second micro-batch on, backward hands each parameter a fresh gradient that is then added
# into the one accumulated so far: one more copy of the largest trainable tensor is alive for a moment
# (fitted on CPU: full fine-tuning in 1-row micro-batches, where it is the 152K x 896 embedding).
GRAD_ACCUMULATION_TEMPORARIES = 1
# Backward holds gradient tensors of the layer it is in next to the saved activations: measured
# 0.21-0.41 of one layer's saved activations (ru_maxrss, tiny Qwen2 on CPU, bf16/fp32, full/LoRA).
BACKWARD_WORKSPACE_LAYERS = 0.5
# With checkpointing, backward re-runs one layer's forward and holds its activations (recompute
# plus workspace measured at 1.19 layers for a tiny fp32 Qwen2 on CPU; we model 1 + 0.5). This working
# set comes after the LM head and loss have freed theirs (plan_memory overlaps the two).
CHECKPOINT_RECOMPUTE_LAYERS = 1.0
# With offloading, checkpoints of this many layers sit on the device at once (one in use, one in flight).
OFFLOAD_RESIDENT_LAYERS = 2
# Backward through a tiled MLP holds H-wide tensors of the whole call that the (smaller) tiled layer's workspace
# no longer covers: the incoming gradient, the input gradient the tiler fills shard by shard, and their sum into
# the residual stream's gradient. Fitted on the trace of Qwen3-8B's widths (4 layers, QLoRA, 65,536 tokens:
# trace - plan = 3.0 · N·H·B before this term).
TILED_MLP_BACKWARD_BUFFERS = 3


def offloaded_bytes(shape: ModelShape, x: RunSpec, tokens: int) -> tuple[int, str]:
    """Host bytes of one update micro-batch's offloaded tensors and the formula: what offload.py moves, each
    tensor of at least OFFLOAD_MIN_BYTES, a tensor saved twice copied once, into exact-size pinned buffers
    (memory/pinned.py) that the next micro-batch reuses. With checkpointing: the L layer inputs
    (tokens·H·B each), the final RMSNorm's float32 input (tokens·H·4: saved by its square and its scale) and
    its normalised output (tokens·H·B), its rsqrt (tokens·4) and the input ids (tokens·8) where they reach the
    minimum, and what the fused head + loss (loss/fused.py) forms in forward and saves for backward: the float32
    gradient of the completion positions' hidden states (m·T·H·4) and, when the head is trained, of its
    weight (V·H·4). Measured on a tiny Qwen2 in float32 and bfloat16: tests/memory/test_pinned_pool.py."""
    B, H, L = x.compute_bytes, shape.hidden, shape.layers
    head_tokens = x.micro_rows * x.max_completion_length
    parts = [(f"{L}·{num(tokens)}·{H}·{B} (layer inputs)", L, tokens * H * B),  # (what, how many, bytes each)
             (f"{num(tokens)}·{H}·4 (final norm fp32 input)", 1, tokens * H * 4),
             (f"{num(tokens)}·{H}·{B} (normalised)", 1, tokens * H * B),
             (f"{num(tokens)}·4 (rsqrt)", 1, tokens * 4),
             (f"{num(tokens)}·8 (input ids)", 1, tokens * 8)]
    if x.chunked_loss:  # the fused head + loss; a trained head's gradient is accumulated in fp32 over the chunks
        parts.append((f"{num(head_tokens)}·{H}·4 (hidden gradient)", 1, head_tokens * H * 4))
        if not x.lora:
            parts.append((f"{num(shape.vocab)}·{H}·4 (LM head gradient)", 1, shape.vocab * H * 4))
    kept = [(what, count * each) for what, count, each in parts if each >= OFFLOAD_MIN_BYTES]
    total = sum(b for _, b in kept)
    return total, (" + ".join(what for what, _ in kept) or "nothing reaches the minimum") + \
        f" = {num(total)} in pinned host RAM"


def trainable(shape: ModelShape, x: RunSpec) -> tuple[int, int, int]:
    """(trainable params, their bytes per value, largest trainable tensor in params)."""
    if x.lora:
        n = lora_num_params(shape, x.lora_rank, x.lora_target_modules)
        dims = shape.linear_dims()
        largest = max(x.lora_rank * max(dims[m]) for m in lora_targets(x.lora_target_modules))
        return n, LORA_ADAPTER_BYTES, largest
    largest = max(shape.embedding_params, max(i * o for i, o in shape.linear_dims().values()))
    return shape.num_params, x.param_dtype_bytes, largest


def optimizer_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    n, b, largest = trainable(shape, x)
    what = "LoRA params" if x.lora else "params"
    grads = Component("gradients", n * b, "always", f"{what}·{b} B = {num(n)}·{b}, in DDP's all-reduce buckets "
                      "(gradient_as_bucket_view): held all run") if x.ddp else \
        Component("gradients", n * b, "update", f"{what}·{b} B = {num(n)}·{b}")
    master = x.fp32_master
    if master:  # the moments follow the float32 master copy the step updates
        state = Component("optimizer state", n * MASTER_WEIGHT_BYTES * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments in float32 (master weights): "
                          f"{num(n)}·{ADAMW_STATES}·{MASTER_WEIGHT_BYTES} B")
    elif x.optimizer == "adamw":
        state = Component("optimizer state", n * b * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments in param dtype: {num(n)}·{ADAMW_STATES}·{b} B")
    else:
        state = Component("optimizer state", math.ceil(n * ADAMW_8BIT_BYTES_PER_PARAM), "always",
                          f"8-bit AdamW: {num(n)}·{ADAMW_8BIT_BYTES_PER_PARAM:.3f} B")
    sb = MASTER_WEIGHT_BYTES if master else b
    cast = largest * MASTER_WEIGHT_BYTES if master else 0  # one tensor's float32 gradient while it steps
    if x.device == "cpu" and x.optimizer == "adamw":
        temp = CPU_ADAMW_STEP_TEMPORARIES * largest * sb + cast
        step = Component("optimizer step workspace", temp, "update",
                         f"per-tensor AdamW temporaries: {CPU_ADAMW_STEP_TEMPORARIES}·{num(largest)}·{sb} B"
                         + (f" + its float32 gradient, {num(largest)}·{MASTER_WEIGHT_BYTES} B" if master else ""))
    elif master:
        step = Component("optimizer step workspace", cast, "update",
                         f"fused AdamW on the master copy: one tensor's float32 gradient, "
                         f"{num(largest)}·{MASTER_WEIGHT_BYTES} B")
    else:
        step = Component("optimizer step workspace", 0, "update",
                         "fused AdamW (cuda) / blockwise 8-bit kernels: no temporaries")
    micro_batches = -(-x.rows // x.micro_rows)
    accumulate = GRAD_ACCUMULATION_TEMPORARIES * largest * b if micro_batches > 1 else 0
    acc = Component("gradient accumulation", accumulate, "update",
                    f"{micro_batches} micro-batches: the next gradient of the largest trainable tensor before it is "
                    f"added, {GRAD_ACCUMULATION_TEMPORARIES}·{num(largest)}·{b} B" if accumulate else
                    "one micro-batch per step: gradients are written once")
    out = [grads, acc, state, step]
    if master:
        out.append(Component("fp32 master weights", n * MASTER_WEIGHT_BYTES, "always",
                             f"memory.bf16_update: a float32 copy of each trained bf16 weight, "
                             f"N·{MASTER_WEIGHT_BYTES} B = {num(n)}·{MASTER_WEIGHT_BYTES}"))
    return out


def offloads_to_host(x: RunSpec) -> bool:
    """memory.offload_activations on CUDA (it needs checkpointing): the checkpoints and the final norm's saved
    tensors wait in host memory (update/offload.py); on CPU offloading changes nothing."""
    return x.offload_activations and x.device == "cuda"


def activation_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    B = x.compute_bytes
    L, H = shape.layers, shape.hidden
    layer_bytes, tokens, mask_shared, what = update_layer_bytes(shape, x)
    final_norm = tokens * ((4 + 2 * B) * H + 4)
    on_host = offloads_to_host(x)
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
                         f"S² mask shared by the layers: {num(mask_shared)} B" if mask_shared else
                         f"unpadded rows, {kname} causal kernel: no mask"))
    # A tiled MLP's shard runs backward at another moment of the layer's backward than the norm's workspace:
    # only what exceeds that workspace adds to the peak.
    out.extend(after_freed(_tiled_mlp_components(shape, x), "tiled MLP shard", workspace,
                            "the layer's backward workspace (alive at another moment)"))
    return out


def _tiled_mlp_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    """With the tiled MLP, backward re-runs one shard of the largest MLP call at a time: that shard's MLP
    intermediates plus their gradients, (R + W)·k·(MLP bytes per token), k = ceil(N / ceil(N / H)); beside them
    TILED_MLP_BACKWARD_BUFFERS H-wide gradient tensors of the whole call, N·H·B each."""
    groups = shared_prompt_groups(x, shape)
    m, P, T = x.micro_rows, x.max_prompt_length, x.max_completion_length
    calls = (groups * P, m * T) if groups else (m * x.seq_len,)
    largest = max(calls)
    if not mlp_tiled(shape, x, largest):
        return []
    k = tiled_shard_tokens(largest, shape.hidden)
    work = CHECKPOINT_RECOMPUTE_LAYERS + BACKWARD_WORKSPACE_LAYERS
    per_token = mlp_bytes_per_token(shape, x)
    buffers = TILED_MLP_BACKWARD_BUFFERS * largest * shape.hidden * x.compute_bytes
    return [Component("tiled MLP shard", math.ceil(work * k * per_token) + buffers, "update",
                      f"backward re-runs one MLP shard: {work:g}·k·(MLP bytes per token), k = ceil(N / ceil(N/H)) = "
                      f"{num(k)} of N = {num(largest)} tokens, {num(per_token)} B/token; + {TILED_MLP_BACKWARD_BUFFERS}"
                      f"·N·H·B gradient buffers of the whole call")]


def buffer_components(x: RunSpec) -> list[Component]:
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


def overlap_recompute(activations: list[Component], loss: Component, final_norm: int, offloaded: bool,
                       kept_after_loss: int, final_norm_backward: int) -> list[Component]:
    """The LM head and loss run (and free their chunks), and the final norm runs backward (freeing what it
    saved), before backward reaches the decoder, where each layer's backward holds its workspace (and, with
    checkpointing, the layer recomputed): these working sets are alive one after the other. So the recompute
    line only holds what exceeds the loss working set plus the final norm's saved tensors (the trace showed the
    final-norm part: docs/benchmarks.md#trace-check). ``offloaded``: those saved tensors wait in host memory, so
    freeing them frees nothing on the device. ``kept_after_loss``: the part of the loss line still alive after
    the LM head's backward (:func:`loss_kept_after`).

    Without checkpointing the backward workspace line holds the larger of two moments after the loss's chunks
    are freed, beyond those chunks: the final norm's own backward (``final_norm_backward``, its fp32
    temporaries, while every saved tensor is still alive) and a layer's (its workspace, after the final norm's
    saved tensors are freed). Traced on W-long 8 x 8K (docs/benchmarks.md#plan-vs-measured): the peak is the
    final norm's backward, the loss's chunks gone, the head's fp32 gradient and the hidden-state gradient
    alive."""
    freed, what = loss.bytes + final_norm, "the loss working set and the final norm's saved tensors"
    if offloaded:
        freed, what = loss.bytes, "the loss working set"
    out = after_freed(activations, "recompute working set", freed, what)
    chunks = loss.bytes - kept_after_loss
    lines = []
    for c in out:
        if c.name == "backward workspace" and c.bytes:
            at_layers = max(0, c.bytes - final_norm)
            moment = max(final_norm_backward, at_layers)
            c = Component(c.name, max(0, moment - chunks), c.phase,
                          f"{c.formula} = {num(c.bytes)}; its moments: the final norm's backward, "
                          f"{NORM_BACKWARD_FP32_TENSORS}·tokens·H·4 fp32 = {num(final_norm_backward)}, a layer's, "
                          f"after the final norm's saved tensors ({num(final_norm)}) are freed = {num(at_layers)}; "
                          f"the larger, beyond the loss's chunks and per-token tensors ({num(chunks)}), freed "
                          f"before both: max(0, difference)")
        lines.append(c)
    return lines


def gradients_in_backward(shape: ModelShape, x: RunSpec, optimizer: list[Component],
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
    n, b, _ = trainable(shape, x)
    L, VH = shape.layers, shape.embedding_params
    g = (n // L if x.lora else shape.layer_params) * b
    layer_bytes, tokens = update_layer_bytes(shape, x)[:2]
    groups = shared_prompt_groups(x, shape)
    prompt_layer = prompt_pass_layer_bytes(shape, x, groups)[0] if groups else 0
    if not x.gradient_checkpointing:
        a = layer_bytes - prompt_layer
    else:  # the layer's checkpointed input goes with it; offloaded ones were never on the device
        a = 0 if offloads_to_host(x) else tokens * shape.hidden * x.compute_bytes
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
        what = (f"at backward's peak, one micro-batch: each layer's g = {num(g)} B written as its a = {num(a)} B "
                "are freed, g + max(0, (L-1)·(g - a)) + final norm")
    elif need == at_embedding:
        tied = " + the tied head and embedding gradients summed, 2·V·H·b" if shape.tie else ""
        kept = f" + the prompt pass's saved tensors, L·{num(prompt_layer)}" if groups else ""
        what = (f"at the embedding's backward, every gradient{tied}{kept}, less backward's activations + loss "
                f"({num(held)})")
    else:
        what = (f"at the optimizer step, after backward's activations + loss ({num(held)}) are freed (one micro-"
                f"batch: at backward's peak only {num(live)} exist)")
    line = Component("gradients", need, "update", f"{grads.formula} in all; {what}")
    return [line if c is grads else c for c in optimizer]


def overlap_step_workspace(optimizer: list[Component], backward: list[Component]) -> list[Component]:
    """The optimizer step runs after backward has freed activations and the loss working set, so its
    temporaries only add what exceeds them: the step workspace line holds max(0, temporaries - those)."""
    held = sum(c.bytes for c in backward if c.location == "device")
    return after_freed(optimizer, "optimizer step workspace", held, "backward's activations + loss")


def critic_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    """PPO's critic (update/critic.py): its weights, gradients, optimizer state and per-token buffers. Its
    forward and backward run after the policy's backward has freed its activations, and keep no more than
    the policy's (no LM head): they add no line of their own."""
    if not x.ppo:
        return []
    head = (shape.hidden + 1) * 4  # Linear(hidden, 1) in fp32
    if x.lora:
        n, b = lora_num_params(shape, x.lora_rank, x.lora_target_modules), LORA_ADAPTER_BYTES
        weights = Component("critic adapter + value head", n * b + head, "always",
                            f"a second LoRA adapter on the same base, L·Σ r·(in+out)·{b} B + (H+1)·4 = "
                            f"{num(n)}·{b} + {num(head)}")
    else:
        n, b = shape.num_params, x.param_dtype_bytes
        weights = Component("critic model + value head", n * b + head, "always",
                            f"full fine-tuning: a second model (critic.model_path, assumed the policy's shape), "
                            f"N·{b} B + (H+1)·4 = {num(n)}·{b} + {num(head)}")
    grads = Component("critic gradients", n * b + head, "update", f"{num(n)}·{b} + {num(head)}")
    master = x.fp32_master  # a full-fine-tuning critic shares the policy's optimizer and its rule
    if master:
        state = Component("critic optimizer state", (n * MASTER_WEIGHT_BYTES + head) * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} float32 moments (master weights): "
                          f"({num(n)}·{MASTER_WEIGHT_BYTES} + {num(head)})·{ADAMW_STATES}")
    elif x.optimizer == "adamw":
        state = Component("critic optimizer state", (n * b + head) * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments: ({num(n)}·{b} + {num(head)})·{ADAMW_STATES}")
    else:
        state = Component("critic optimizer state", math.ceil(n * ADAMW_8BIT_BYTES_PER_PARAM) + head * ADAMW_STATES,
                          "always", f"8-bit AdamW: {num(n)}·{ADAMW_8BIT_BYTES_PER_PARAM:.3f} B + head")
    rows, T = x.rows, x.max_completion_length
    buffers = Component("value buffers", 4 * rows * T * 4, "always",
                        f"old values, returns, advantages, token rewards [rows, T] fp32: 4·{rows}·{T}·4")
    out = [weights, grads, state, buffers]
    if master:
        out.append(Component("critic fp32 master weights", n * MASTER_WEIGHT_BYTES, "always",
                             f"a float32 copy of each critic weight, {num(n)}·{MASTER_WEIGHT_BYTES} B"))
    return out
