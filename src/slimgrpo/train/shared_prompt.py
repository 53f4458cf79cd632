"""Shared prompts in the update: each group's prompt goes through the model once, not once per completion.

The G completions of a GRPO group share their prompt.  The plain update runs ``G`` copies of
``prompt + completion`` through the decoder, so a 2K-token prompt with 8 x 256-token completions costs
8 x 2,304 token positions of forward, backward and activation memory.  Here::

    prompt forward     [groups, P]        with a KV cache (keeps the graph: gradients flow through it)
    cache fan-out      K, V [groups] -> [rows] by index (backward sums the rows' gradients per group)
    completion forward [rows, T]          attending to the fanned-out prompt KV
    hidden predicting completion token 0 = the prompt's last hidden state (fanned out); token t >= 1 =
    the completion's hidden state at t - 1

so the prompt costs one forward and one backward per group, and the gradients are those of the plain
path (the same positions, masks and attention, summed in another order).  Groups are found by comparing
rows: adjacent rows with the same prompt ids and mask form one group, so a micro-batch that splits a
group still works (each part shares within itself).

Not used with gradient checkpointing (Hugging Face models drop the KV cache while checkpointing in
training mode) nor under FSDP2 (each sharded layer would run forward twice before one backward, which
is untested there); ``applicable`` decides.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from slimgrpo.loss.logprobs import (
    HeadSpec,
    _check_completion_inputs,
    completion_position_ids,
    lm_head_spec,
    unwrap_causal_lm,
)


def row_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(first_row [groups], group_of_row [rows])``: runs of adjacent rows with the same prompt."""
    rows = prompt_ids.shape[0]
    same = torch.ones(rows, dtype=torch.bool, device=prompt_ids.device)
    if rows > 1:
        same[1:] = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)
    same[0] = False
    group_of_row = torch.cumsum(~same, 0) - 1  # [rows]
    first_row = (~same).nonzero().squeeze(1)  # [groups]
    return first_row, group_of_row


def applicable(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int) -> bool:
    """Sharing saves work (some rows share a prompt) and the model can run it (no checkpointing)."""
    lm = unwrap_causal_lm(model)
    if any(getattr(m, "gradient_checkpointing", False) is True for m in lm.modules()):
        return False
    if any(hasattr(m, "_fsdp_state") or "FSDP" in type(m).__name__ for m in lm.modules()):
        return False  # FSDP2: each layer would run forward twice before one backward (untested)
    P = input_ids.shape[1] - num_completion_tokens
    if P < 1 or input_ids.shape[0] < 2:
        return False
    first_row, _ = row_groups(input_ids[:, :P], attention_mask[:, :P])
    return first_row.numel() < input_ids.shape[0]


def shared_completion_hidden(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    num_completion_tokens: int,
    completion_ids: Tensor,
    completion_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, HeadSpec]:
    """Same contract as ``logprobs.completion_hidden``, with each group's prompt run once."""
    T = num_completion_tokens
    _check_completion_inputs(input_ids, attention_mask, T, completion_ids, completion_mask)
    lm = unwrap_causal_lm(model)
    decoder = lm.get_decoder()
    P = input_ids.shape[1] - T
    prompt_ids, prompt_mask = input_ids[:, :P], attention_mask[:, :P]
    first_row, group_of_row = row_groups(prompt_ids, prompt_mask)
    positions = completion_position_ids(attention_mask)  # [rows, P + T]

    cache = DynamicCache(config=lm.config)
    g_mask = prompt_mask[first_row]
    prompt_out = decoder(input_ids=prompt_ids[first_row], attention_mask=g_mask,
                         position_ids=positions[first_row, :P], past_key_values=cache, use_cache=True)
    last_prompt = prompt_out[0][:, -1]  # [groups, H]: predicts completion token 0
    cache.batch_select_indices(group_of_row)  # K, V [groups] -> [rows]; backward sums per group
    comp_out = decoder(input_ids=input_ids[:, P:], attention_mask=attention_mask,
                       position_ids=positions[:, P:], past_key_values=cache, use_cache=True)
    hidden = torch.cat([last_prompt[group_of_row][:, None], comp_out[0][:, :-1]], dim=1)  # [rows, T, H]
    mask = (attention_mask[:, -T:] if completion_mask is None else completion_mask).bool()
    return hidden[mask], completion_ids[mask], mask, lm_head_spec(lm)


__all__ = ["applicable", "row_groups", "shared_completion_hidden"]
