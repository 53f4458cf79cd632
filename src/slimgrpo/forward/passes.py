"""One pass of the model over completion rows, into the loss's pure head kernels: the decoder through a forward
layout (``hidden_fn``: ``rows.completion_hidden`` by default; the update's choice is ``layout.choose_layout``), then
the LM head chunk by chunk, so that the ``[rows, tokens, vocab]`` logits never exist.

- ``completion_logprobs``: per-token log-probs (and entropy) through ``loss.chunked_head``;
- ``completion_loss``: the objective's loss through the fused head + loss, ``loss.fused``.

Both return ``[rows, T]`` tensors, zeros off the scored tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from slimgrpo.forward.rows import CompletionRows, layout_hidden
from slimgrpo.loss.chunked_head import chunked_token_logprobs
from slimgrpo.loss.fused import fused_token_loss


def _rows_of(mask: Tensor, flat: Tensor | None) -> Tensor | None:
    """``flat`` [n] scattered into ``[rows, T]`` float32 zeros where ``mask`` is set."""
    if flat is None:
        return None
    return torch.zeros(mask.shape, device=flat.device, dtype=torch.float32).masked_scatter(mask, flat)


def completion_logprobs(
    model: nn.Module,
    rows: CompletionRows,
    *,
    temperature: float = 1.0,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    hidden_fn=None,
) -> tuple[Tensor, Tensor | None]:
    """``log pi(o_t | q, o_<t)`` for every completion token, without full logits.

    Args:
        model: a Hugging Face causal LM, optionally wrapped in a peft ``PeftModel``.  It must be
            callable module by module (not a DDP wrapper; FSDP2 ``fully_shard`` needs the caller
            to unshard the root-held parameters, embeddings and head).
        rows: the padded rows (checked by ``hidden_layout``):
            ``input_ids`` ``[rows, P + T]`` left-padded prompt followed by right-padded completion;
            ``attention_mask`` ``[rows, P + T]`` 1 on real tokens (prompt and completion), 0 on padding;
            ``T`` the completion length, the last ``T`` columns of ``input_ids``;
            ``completion_ids`` ``[rows, T]`` the completion tokens (``input_ids[:, -T:]``), the targets;
            ``completion_mask`` ``[rows, T]`` bool, the tokens to score (None:
            ``attention_mask[:, -T:]``); other positions get 0 and are never sent through the head.
        temperature: divides the logits, as during sampling.
        token_chunk, vocab_chunk: passed to ``chunked_token_logprobs``.
        return_entropy: also return the per-token entropy (no gradient).
        entropy_grad: give the entropy a gradient (the entropy bonus, ``loss.entropy_coef``).
        hidden_fn: replaces ``completion_hidden`` (same signature), e.g.
            ``loss.shared_prompt.shared_completion_hidden``.

    Returns:
        ``(logp [rows, T] float32, entropy [rows, T] float32 or None)``.

    The backbone (``get_decoder()``) runs once with ``position_ids = cumsum(mask) - 1`` so left
    padding does not shift positions; the hidden state at position ``P + t - 1`` predicts
    completion token ``t``, i.e. columns ``-T-1 .. -2`` predict the last ``T`` tokens.
    """
    hidden, targets, mask, head = layout_hidden(model, rows, hidden_fn)
    logp_flat, entropy_flat = chunked_token_logprobs(
        hidden,  # [n, H], only the scored tokens
        head,
        targets,  # [n]
        temperature=temperature,
        token_chunk=token_chunk,
        vocab_chunk=vocab_chunk,
        return_entropy=return_entropy,
        entropy_grad=entropy_grad,
    )
    return _rows_of(mask, logp_flat), _rows_of(mask, entropy_flat)


def completion_loss(
    model,
    rows: CompletionRows,
    objective: Callable[[Tensor], Tensor],
    *,
    temperature: float = 1.0,
    token_chunk: int | None = None,
    return_entropy: bool = False,
    hidden_fn=None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``objective(logp)`` of a causal LM's completions through the fused head.

    Arguments as for ``completion_logprobs`` (``rows`` and ``hidden_fn`` included); ``objective`` maps
    ``logp [rows, T]`` float32 (zeros off ``rows.completion_mask``) to a scalar loss.  Returns ``(loss,
    logp [rows, T], entropy [rows, T] or None)``; only ``loss`` carries gradient (into the model's parameters).
    """
    hidden, targets, mask, head = layout_hidden(model, rows, hidden_fn)

    def flat_objective(flat: Tensor) -> Tensor:
        return objective(torch.zeros(mask.shape, device=flat.device, dtype=flat.dtype).masked_scatter(mask, flat))

    loss, logp_flat, entropy_flat = fused_token_loss(
        hidden, head, targets, flat_objective, temperature=temperature, token_chunk=token_chunk,
        return_entropy=return_entropy)
    return loss, _rows_of(mask, logp_flat), _rows_of(mask, entropy_flat)


__all__ = ["completion_logprobs", "completion_loss"]
