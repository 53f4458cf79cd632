"""The planner's modelling constants and closed-form formulas (pure: no torch): bytes per token and layer,
logits, KV cache, LoRA counts, the tiled MLP's terms. ``planner.py`` puts them together into a plan and
re-exports every name here, so callers import them from ``slimgrpo.plan.planner`` as before.

Every modelling constant lives in the block below so that calibration (docs/memory.md) can adjust them in
one place. Symbols as in ``planner.py``'s docstring; the derivations are in docs/memory.md.
"""

from __future__ import annotations


from slimgrpo.memory import attention as attn_kernels
from slimgrpo.config.sections.memory import bf16_update_rule

from slimgrpo.plan.types import LORA_MODULES, PlanInputs
from slimgrpo.plan.shapes import FAMILIES, ModelShape

KiB, MiB, GiB = 1024, 1024**2, 1024**3

# ----------------------------------------------------------------------------------------------
# Modelling constants (calibrate here)
# ----------------------------------------------------------------------------------------------
# CUDA context, cuBLAS/cuDNN workspaces and allocator slack: real device memory that
# torch.cuda.max_memory_allocated() does not see but nvidia-smi does.
CUDA_FRAMEWORK_OVERHEAD_BYTES = 512 * MiB
# Peak RSS of a bare Python that imported torch 2.13 (CPU), transformers 5.25, peft 0.21 (which imports
# torchao 0.18) and the Qwen2/Llama model classes: ru_maxrss = 373,480 KiB (about 365 MiB; three runs within
# 0.2 MiB), measured on the 2-core development machine on 2026-12-04 (with transformers 5.23 it was 352,396 KiB:
# the constant follows the versions installed, re-measure it when they move). On CPU the floor under every plan.
CPU_FRAMEWORK_OVERHEAD_BYTES = 373_480 * KiB
# The tokenizer a run loads (its vocabulary and merges as Rust and Python objects): RSS it keeps once loaded, in a
# process that imported the trainer, measured for three fast BPE tokenizers on the development machine: Qwen2's
# 151,936 entries 152 MiB, SmolLM2's 49,152 entries 45 MiB, a 32,000-entry Llama one 31 MiB, about 1,000 B per
# entry (docs/memory.md#framework-overhead-always). Host memory: in the plan's peak on CPU only.
TOKENIZER_BYTES_PER_VOCAB = 1_000


def tokenizer_bytes(vocab: int) -> int:
    """RSS a loaded tokenizer of ``vocab`` entries keeps (TOKENIZER_BYTES_PER_VOCAB each)."""
    return TOKENIZER_BYTES_PER_VOCAB * vocab


def cpu_runtime_bytes(vocab: int) -> int:
    """What a CPU run's RSS holds besides tensors: the imports (CPU_FRAMEWORK_OVERHEAD_BYTES) and the tokenizer."""
    return CPU_FRAMEWORK_OVERHEAD_BYTES + tokenizer_bytes(vocab)


# Caching allocator rounding, fragmentation and stream-ordered reuse on CUDA, as a fraction of the tensor
# peak: what the trace adds for its device peak (trace/step.py), and the least headroom `slimgrpo plan`
# asks of a budget before it says "fits" without a warning. A documented guess (docs/memory.md#trace), to be
# replaced by the measured max_memory_reserved / traced ratio of the GPU suite.
CUDA_TRACE_MARGIN = 0.10

# LoRA adapters are kept in fp32 (peft's get_peft_model(autocast_adapter_dtype=True) default).
LORA_ADAPTER_BYTES = 4
# bitsandbytes NF4 with double quantisation (the QLoRA recipe): 4 bits per weight, one 8-bit
# absmax per block of 64 weights, one fp32 constant per 256 blocks -> 4.127 bits per weight.
NF4_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
# Compute dtype of a 4-bit base; embeddings, norms, biases and the LM head stay in it.
QLORA_COMPUTE_BYTES = 2
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
# A decoder layer's RMSNorm runs backward through its decomposed fp32 ops (upcast, square, mean, rsqrt, scale):
# up to this many fp32 H-wide gradient temporaries are alive at once, beside this many compute-dtype H-wide
# gradients of the residual stream (traced on Qwen3-8B / Llama-3.1-8B widths, LoRA, bf16). Where a layer's
# activations are small (LoRA with the MLP tiled) this, not BACKWARD_WORKSPACE_LAYERS of a layer, is the
# workspace beside the recomputed layer.
NORM_BACKWARD_FP32_TENSORS = 5
NORM_BACKWARD_RESIDUAL_GRADS = 3
# With checkpointing, backward re-runs one layer's forward and holds its activations (recompute
# plus workspace measured at 1.19 layers for a tiny fp32 Qwen2 on CPU; we model 1 + 0.5). This working
# set comes after the LM head and loss have freed theirs (plan_memory overlaps the two).
CHECKPOINT_RECOMPUTE_LAYERS = 1.0
# With offloading, checkpoints of this many layers sit on the device at once (one in use, one in flight).
OFFLOAD_RESIDENT_LAYERS = 2
# Activation offload (update/offload.py) moves only saved tensors of at least this many bytes.
OFFLOAD_MIN_BYTES = 1 << 20

# Chunked LM head: float32 [token_chunk, vocabulary slice] blocks alive at once (loss/chunked_head.py,
# loss/fused.py), as issue 43's matrix traces them (tests/plan/test_plan_matrix.py):
# - the fused head + loss (loss/fused.py, where ``config.sections.loss.takes_fused_path`` holds: the default GRPO
#   family): the logits block and the softmax scratch beside it;
# - log-probs, then the loss (the separate path): the logits block, in forward and again in backward; one more
#   with a frozen head and one vocabulary slice (LoRA: forward forms dlogp/dh beside the entropy's e·log e block)
#   or with the entropy bonus (backward's softmax beside the logits).
# A 16-bit compute dtype adds the head output in that dtype: half an fp32 block more.
# (Until the trace took the separable path its runs take (fused._not_separable), it also ran the fallback's second
# chunked pass; these counts were then 3 and, 16-bit, 4.)
LOSS_BLOCKS_FUSED = 2
LOSS_BLOCKS_SEPARATE = 1
LOSS_BLOCKS_SEPARATE_EXTRA = 1  # the frozen head's dlogp/dh pass, or the entropy bonus's backward
# [n, H] float32 temporaries of one token chunk's hidden-state gradient (chunked_head._backprop_slice: the target
# rows of W, their scaled copy, p·W, the difference), beside the [N, H] accumulator; they weigh where one chunk
# spans the micro-batch (a small vocabulary).
LOSS_CHUNK_HIDDEN_TEMPORARIES = 3
# Full-logits path (TRL-like): logits and their gradient in the compute dtype.
FULL_LOGITS_COPIES = 2
# Per-token fp32 tensors of the GRPO objective (log-probs, ratio, clipped terms, KL, masks...).
LOSS_PER_TOKEN_TENSORS = 12

# Decode: fp32 logits of the last position for every row, plus the sampling workspace (rollout/engine.py drops a
# step's logits once sampled; a 16-bit head's own output is counted beside them, generation.generation_components).
GEN_LOGITS_COPIES = 2
# The rollout prefills prompts this many positions at a time (rollout/engine.py TorchRolloutEngine's
# prefill_chunk): the prefill's working set is one chunk's, not the whole prompt's.
PREFILL_CHUNK_TOKENS = 2048
# memory.tiled_mlp=auto turns the tiled MLP on only where one update micro-batch runs at least this many
# tokens through each MLP and tiling lowers the planned peak by at least TILED_MLP_MIN_GAIN of it: shorter
# runs keep the untiled MLP (no extra MLP forward in backward; their plans and measurements do not move: the
# longest measured rows, docs/benchmarks.md, run 32,768-33,024 tokens per micro-batch). memory.fit's ladder
# turns it on below this where a budget needs it.
TILED_MLP_AUTO_TOKENS = 65_536
TILED_MLP_MIN_GAIN = 0.02
# Backward through a tiled MLP holds H-wide tensors of the whole call that the (smaller) tiled layer's workspace
# no longer covers: the incoming gradient, the input gradient the tiler fills shard by shard, and their sum into
# the residual stream's gradient. Fitted on the trace of Qwen3-8B's widths (4 layers, QLoRA, 65,536 tokens:
# trace - plan = 3.0 · N·H·B before this term).
TILED_MLP_BACKWARD_BUFFERS = 3



# ----------------------------------------------------------------------------------------------
# Closed-form helpers (tested directly against published arithmetic)
# ----------------------------------------------------------------------------------------------
def logits_bytes(rows: int, tokens: int, vocab: int, dtype_bytes: int = 4, copies: int = 1) -> int:
    """Materialised logits: rows · tokens · vocab · dtype_bytes · copies.

    Llama-3.1-8B, 8 rows of 20,480 tokens, bf16, logits + gradient:
    2 · 2 · 8 · 20,480 · 128,256 = 84,053,852,160 B = 78.3 GiB.
    """
    return rows * tokens * vocab * dtype_bytes * copies


def kv_cache_bytes(layers: int, tokens: int, kv_heads: int, head_dim: int, rows: int = 1, dtype_bytes: int = 2) -> int:
    """KV cache: 2 (keys and values) · dtype_bytes · layers · tokens · kv_heads · head_dim · rows.

    Llama-3.1-8B (32 layers, 8 kv heads of 128), one 20,480-token sequence in bf16:
    2 · 2 · 32 · 20,480 · 1,024 = 2.5 GiB.
    """
    return 2 * dtype_bytes * layers * tokens * kv_heads * head_dim * rows


def lora_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """Expand "all-linear" and drop duplicates, in layer order."""
    wanted = set(LORA_MODULES) if "all-linear" in targets else set(targets)
    return tuple(m for m in LORA_MODULES if m in wanted)


def lora_num_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable LoRA parameters: L · Σ_targets r · (in + out)."""
    dims = shape.linear_dims()
    return shape.layers * sum(rank * sum(dims[m]) for m in lora_targets(targets))


def activation_bytes_per_token_layer(shape: ModelShape, inputs: PlanInputs, padded: bool = False,
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
    B = _compute_bytes(inputs)
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
    if _tiles(shape, inputs, tokens):
        total += -mlp_bytes_per_token(shape, inputs) + (B * H if inputs.lora else 0)
    return total


def norm_backward_bytes_per_token(shape: ModelShape, inputs: PlanInputs, tokens: int | None = None) -> int:
    """Per token, what the post-attention RMSNorm's backward adds to the layer's recomputed activations:
    NORM_BACKWARD_FP32_TENSORS fp32 H-wide temporaries and NORM_BACKWARD_RESIDUAL_GRADS H-wide gradients of the
    residual stream in the compute dtype, less the MLP's saved tensors, which its backward has freed by then
    (the MLP's share of :func:`activation_bytes_per_token_layer`; a tiled MLP's is its kept input). Can be < 0."""
    B = _compute_bytes(inputs)
    if _tiles(shape, inputs, tokens):
        mlp = B * shape.hidden if inputs.lora else 0
    else:
        mlp = mlp_bytes_per_token(shape, inputs)
    return (4 * NORM_BACKWARD_FP32_TENSORS + B * NORM_BACKWARD_RESIDUAL_GRADS) * shape.hidden - mlp


def mlp_bytes_per_token(shape: ModelShape, inputs: PlanInputs) -> int:
    """The MLP's share of :func:`activation_bytes_per_token_layer`, per token: SiLU input and output and up
    output 3·B·I, down_proj's input (B·I, full fine-tuning or a LoRA adapter on it), the adapters' shared
    input on gate / up and their lora_A outputs. What a tiled MLP keeps for one shard instead of the whole call."""
    H, I = shape.hidden, shape.intermediate
    B = _compute_bytes(inputs)
    if not inputs.lora:
        return 4 * B * I
    adapted = set(lora_targets(inputs.lora_target_modules))
    shared = H * B if any(m in adapted for m in ("gate_proj", "up_proj")) else 0
    down = I * B if "down_proj" in adapted else 0
    mids = B * inputs.lora_rank * sum(1 for m in ("gate_proj", "up_proj", "down_proj") if m in adapted)
    return 3 * B * I + down + shared + mids


def _tiles(shape: ModelShape, x: PlanInputs, tokens: int | None) -> bool:
    """The tiled MLP changes a call of ``tokens`` tokens: switched on and more than one shard."""
    return x.tiled_mlp == "on" and tokens is not None and tokens > shape.hidden


def attention_mask_bytes(inputs: PlanInputs, rows: int, tokens: int, padded: bool | None = None,
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
    shared, per_layer, _ = attn_kernels.quadratic_bytes(shape, name, pairs, _compute_bytes(inputs), padded)
    return shared, per_layer


def inference_bytes_per_token_layer(shape: ModelShape, inputs: PlanInputs) -> int:
    """Transient bytes per token of one layer's forward without autograd (prompt prefill).

    B·(2·H + max(2·q + 2·kv', 3·I)) + 4·H: residual and normed input, then the larger of the
    attention tensors (q, output, repeated k and v) and the MLP tensors (gate/up/product), plus
    the RMSNorm fp32 upcast.
    """
    H, I, q = shape.hidden, shape.intermediate, shape.q_dim
    B = _compute_bytes(inputs)
    kv_saved = attn_kernels.kv_width(shape, attn_kernels.kernel(inputs.attn_implementation)[0], inputs.padding_mask,
                                     inputs.device)
    return B * (2 * H + max(2 * q + 2 * kv_saved, 3 * I)) + 4 * H


def _compute_bytes(inputs: PlanInputs) -> int:
    """B: dtype of activations, logits and the KV cache (bf16 compute for a 4-bit base)."""
    return QLORA_COMPUTE_BYTES if inputs.load_in_4bit else inputs.param_dtype_bytes


def _n(x: float) -> str:
    return f"{int(x):,}"


def fp32_master(x: PlanInputs) -> bool:
    """Whether the run keeps float32 master weights: full fine-tuning of 2-byte weights (bfloat16; float16 full
    fine-tuning is refused at validation) whose ``bf16_update`` resolves to ``fp32_master``
    (config/sections/memory.py ``bf16_update_rule``, the rule update/optim.py follows). LoRA adapters are float32."""
    return not x.lora and x.param_dtype_bytes == 2 and bf16_update_rule(x.bf16_update, x.optimizer) == "fp32_master"


def offloaded_bytes(shape: ModelShape, x: PlanInputs, tokens: int) -> tuple[int, str]:
    """Host bytes of one update micro-batch's offloaded tensors and the formula: what offload.py moves, each
    tensor of at least OFFLOAD_MIN_BYTES, a tensor saved twice copied once, into exact-size pinned buffers
    (memory/pinned.py) that the next micro-batch reuses. With checkpointing: the L layer inputs
    (tokens·H·B each), the final RMSNorm's float32 input (tokens·H·4: saved by its square and its scale) and
    its normalised output (tokens·H·B), its rsqrt (tokens·4) and the input ids (tokens·8) where they reach the
    minimum, and what the fused head + loss (loss/fused.py) forms in forward and saves for backward: the float32
    gradient of the completion positions' hidden states (m·T·H·4) and, when the head is trained, of its
    weight (V·H·4). Measured on a tiny Qwen2 in float32 and bfloat16: tests/memory/test_pinned_pool.py."""
    B, H, L = _compute_bytes(x), shape.hidden, shape.layers
    head_tokens = x.micro_rows * x.max_completion_length
    parts = [(f"{L}·{_n(tokens)}·{H}·{B} (layer inputs)", L, tokens * H * B),  # (what, how many, bytes each)
             (f"{_n(tokens)}·{H}·4 (final norm fp32 input)", 1, tokens * H * 4),
             (f"{_n(tokens)}·{H}·{B} (normalised)", 1, tokens * H * B),
             (f"{_n(tokens)}·4 (rsqrt)", 1, tokens * 4),
             (f"{_n(tokens)}·8 (input ids)", 1, tokens * 8)]
    if x.chunked_loss:  # the fused head + loss; a trained head's gradient is accumulated in fp32 over the chunks
        parts.append((f"{_n(head_tokens)}·{H}·4 (hidden gradient)", 1, head_tokens * H * 4))
        if not x.lora:
            parts.append((f"{_n(shape.vocab)}·{H}·4 (LM head gradient)", 1, shape.vocab * H * 4))
    kept = [(what, count * each) for what, count, each in parts if each >= OFFLOAD_MIN_BYTES]
    total = sum(b for _, b in kept)
    return total, (" + ".join(what for what, _ in kept) or "nothing reaches the minimum") + \
        f" = {_n(total)} in pinned host RAM"
