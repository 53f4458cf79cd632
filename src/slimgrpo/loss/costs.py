"""What the chunked LM head and the loss hold in the update (``chunked_head.py``, ``fused.py``, the objective):
the loss working set line of the plan and what of it outlives the head's backward. Symbols as in
``runspec/cost.py``; the derivations are in docs/memory.md."""

from __future__ import annotations

import math

from slimgrpo.runspec.cost import Component, logits_bytes, num
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape

# Chunked LM head: float32 [token_chunk, vocabulary slice] blocks alive at once (chunked_head.py, fused.py), as the
# planner's matrix traces them (tests/plan/test_plan_matrix.py):
# - the fused head + loss (loss/fused.py, where ``config.sections.loss.takes_fused_path`` holds: the default GRPO
#   family): the logits block and the softmax scratch beside it;
# - log-probs, then the loss (the separate path): the logits block, in forward and again in backward; one more
#   with a frozen head and one vocabulary slice (LoRA: forward forms dlogp/dh beside the entropy's e·log e block)
#   or with the entropy bonus (backward's softmax beside the logits).
# A 16-bit compute dtype adds the head output in that dtype: half an fp32 block more.
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


def loss_component(shape: ModelShape, x: RunSpec) -> Component:
    """The loss working set of the largest micro-batch: the chunked head's blocks on its path (``loss_blocks``),
    the gathered hidden states and their gradient, a trained head's fp32 gradient, the objective's per-token
    tensors; or, with ``chunked_loss`` off, full logits and their gradient (a trainer without a chunked head)."""
    B = x.compute_bytes
    m = x.micro_rows
    T, V, H = x.max_completion_length, shape.vocab, shape.hidden
    per_token = LOSS_PER_TOKEN_TENSORS * m * T * 4
    if not x.chunked_loss:
        b = logits_bytes(m, T, V, B, FULL_LOGITS_COPIES) + per_token
        return Component("loss working set", b, "update",
                         f"full logits: {FULL_LOGITS_COPIES}·m·T·V·B = {FULL_LOGITS_COPIES}·{m}·{num(T)}·{num(V)}·{B}"
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
                     f"chunked, {path}: {blocks:g}·{num(chunk)} tokens·{num(vc)} vocab·4 B + m·T·H·(4+{B}) (hidden "
                     f"grad, gathered hidden) + {LOSS_CHUNK_HIDDEN_TEMPORARIES}·{num(chunk)}·H·4 (per-chunk "
                     f"temporaries){head} + {LOSS_PER_TOKEN_TENSORS}·m·T·4")


def loss_blocks(x: RunSpec, one_slice: bool) -> tuple[float, str]:
    """fp32 ``[chunk, vocabulary slice]`` blocks the chunked head holds at once, and the path's name (formulas:
    LOSS_BLOCKS_*): a 16-bit compute dtype adds half a block (the head output in that dtype)."""
    if x.fused_loss:
        blocks, path = LOSS_BLOCKS_FUSED, "fused head + loss"
    else:
        extra = x.entropy_bonus or (x.lora and one_slice)  # backward's softmax / the frozen head's dlogp/dh pass
        blocks, path = LOSS_BLOCKS_SEPARATE + (LOSS_BLOCKS_SEPARATE_EXTRA if extra else 0), "log-probs then loss"
    return blocks + (0.0 if x.compute_bytes == 4 else 0.5), path


def loss_kept_after(shape: ModelShape, x: RunSpec) -> int:
    """Of the chunked loss line, what outlives the LM head's backward: the hidden-state gradient (m·T·H·4) and
    a trained head's fp32 gradient accumulator (V·H·4). The full-logits path frees its logits."""
    if not x.chunked_loss:
        return 0
    return x.micro_rows * x.max_completion_length * shape.hidden * 4 + (0 if x.lora else shape.vocab * shape.hidden * 4)
