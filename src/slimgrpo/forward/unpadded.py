"""Completion log-probs of unpadded rows: no attention mask, so no ``[rows, 1, S, S]`` tensor.

The padded layout (``logprobs.completion_logprobs``) puts every row's prompt flush right (left
padding) so that all completions start in the same column; Hugging Face then needs a padding mask,
which it expands to ``[rows, 1, S, S]`` (and SDPA converts per layer to the query dtype): memory
that grows with ``S²``.

Here each row is laid out as its real prompt tokens followed by its completion, and rows are
right-padded to the longest of the micro-batch::

    row 0:  p p p c c c c _ _        prompt length 3, completion length 4
    row 1:  p p p p p c c c c        prompt length 5, completion length 4

Under causal attention a token only sees earlier positions, so padding at the end of a row never
reaches a real token: the decoder runs with ``attention_mask=None`` (SDPA's ``is_causal`` path,
flash / memory-efficient kernels, O(S) memory; flash_attention_2 likewise) and
``position_ids = arange`` (the same positions ``cumsum(mask) - 1`` gives a left-padded row).
Hidden state ``p_i - 1 + t`` of row ``i`` predicts its completion token ``t``; padded positions are
never sent through the LM head and are masked out of the loss. The result equals the padded path
up to floating-point summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.forward.rows import lm_head_spec
from slimgrpo.loss.chunked_head import chunked_token_logprobs


def unpad_rows(input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
               rows: Tensor | None = None, pad_id: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Re-lay ``rows`` of a padded batch (left-padded prompt + right-padded completion) unpadded.

    Returns ``(ids [m, Lmax], prompt_lengths [m], completion_lengths [m])``: row ``i`` holds its
    ``prompt_lengths[i]`` real prompt tokens, then its ``completion_lengths[i]`` completion tokens,
    then ``pad_id`` up to ``Lmax = max(prompt + completion length)``.
    """
    T = num_completion_tokens
    if rows is not None:
        input_ids, attention_mask = input_ids[rows], attention_mask[rows]
    P = input_ids.shape[1] - T
    am = attention_mask.bool()
    p_len = am[:, :P].sum(dim=1)
    c_len = am[:, P:].sum(dim=1)
    total = p_len + c_len
    L = max(int(total.max()) if total.numel() else 1, 1)
    m = input_ids.shape[0]
    # Source column of output column j in row i: prompt tokens start at P - p_len (left padding),
    # the completion right after column P - 1.
    j = torch.arange(L, device=input_ids.device).expand(m, L)
    start = (P - p_len).unsqueeze(1)
    src = torch.where(j < p_len.unsqueeze(1), start + j, P + (j - p_len.unsqueeze(1)))
    valid = j < total.unsqueeze(1)
    src = src.clamp(max=input_ids.shape[1] - 1)
    ids = torch.gather(input_ids, 1, src)
    ids = torch.where(valid, ids, torch.full_like(ids, pad_id))
    return ids, p_len, c_len


@dataclass(frozen=True)
class UnpaddedRows:
    """Rows laid out unpadded (``unpad_rows``) with the completion tokens they are scored on."""

    ids: Tensor  # [m, L] prompt then completion per row, right-padded
    prompt_lengths: Tensor  # [m] real prompt tokens per row (>= 1)
    completion_ids: Tensor  # [m, T] completion tokens (targets), right-padded
    completion_mask: Tensor  # [m, T] bool, the tokens to score (inside each row's completion)


def unpadded_completion_logprobs(
    model: nn.Module,
    rows: UnpaddedRows,
    *,
    temperature: float = 1.0,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
    return_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``log pi(o_t | q, o_<t)`` of unpadded rows (see the module docstring, ``unpad_rows`` and
    ``UnpaddedRows``); ``temperature``, ``token_chunk``, ``vocab_chunk`` and ``return_entropy`` as for
    ``chunked_token_logprobs``.

    Returns ``(logp [m, T] float32, entropy [m, T] float32 or None)``; unscored positions are 0.
    """
    ids, prompt_lengths = rows.ids, rows.prompt_lengths
    completion_ids, completion_mask = rows.completion_ids, rows.completion_mask
    if ids.dim() != 2 or completion_ids.dim() != 2 or completion_mask.shape != completion_ids.shape:
        raise ValueError(f"ids [m, L], completion_ids and completion_mask [m, T] expected, got "
                         f"{tuple(ids.shape)}, {tuple(completion_ids.shape)}, {tuple(completion_mask.shape)}")
    if bool((prompt_lengths < 1).any()):
        raise ValueError("every row needs at least one prompt token to predict its first completion token")
    lm = unwrap_causal_lm(model)
    mask = completion_mask.bool()
    picked = scoring_hidden(lm, ids, prompt_lengths, completion_ids.shape[1], mask)  # [n, H]
    head = lm_head_spec(lm)
    logp_flat, entropy_flat = chunked_token_logprobs(
        picked, head, completion_ids[mask], temperature=temperature, token_chunk=token_chunk,
        vocab_chunk=vocab_chunk, return_entropy=return_entropy,
    )
    zeros = torch.zeros(mask.shape, device=logp_flat.device, dtype=torch.float32)
    logp = zeros.masked_scatter(mask, logp_flat)
    entropy = None if entropy_flat is None else zeros.masked_scatter(mask, entropy_flat)
    return logp, entropy


def scoring_hidden(lm: nn.Module, ids: Tensor, prompt_lengths: Tensor, T: int, mask: Tensor) -> Tensor:
    """``[n, H]``: the final hidden states that predict the ``n`` completion tokens under ``mask``
    (``[m, T]``), from one decoder pass over unpadded rows without an attention mask."""
    m, L = ids.shape
    position_ids = torch.arange(L, device=ids.device).unsqueeze(0).expand(m, L)
    hidden = lm.get_decoder()(input_ids=ids, attention_mask=None, position_ids=position_ids, use_cache=False)[0]
    pos = (prompt_lengths.unsqueeze(1) - 1 + torch.arange(T, device=ids.device)).clamp(max=L - 1)  # [m, T]
    rows = torch.arange(m, device=ids.device).unsqueeze(1).expand(m, T)
    return hidden[rows[mask], pos[mask]]


def unpadded_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
                    completion_ids: Tensor, completion_mask: Tensor | None = None):
    """``logprobs.completion_hidden``'s contract (padded rows in, ``(hidden [n, H], targets [n], mask
    [rows, T], head)`` out), computed on the rows re-laid unpadded: the update's default backbone pass,
    which the fused head + loss (``loss.fused``) and the plain chunked head both take as ``hidden_fn``."""
    T = num_completion_tokens
    lm = unwrap_causal_lm(model)
    ids, p_len, _ = unpad_rows(input_ids, attention_mask, T)
    mask = (attention_mask[:, -T:] if completion_mask is None else completion_mask).bool()
    if bool((p_len < 1).any()):
        raise ValueError("every row needs at least one prompt token to predict its first completion token")
    return scoring_hidden(lm, ids, p_len, T, mask), completion_ids[mask], mask, lm_head_spec(lm)
