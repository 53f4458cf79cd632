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
is untested there): ``shares_work`` says so. Nor where it would keep more memory than the plain update:
the completion pass attends through a [rows, 1, T, P + T] mask (and sdpa then repeats keys and values to
query width), which outweighs the saving when completions are long and the prompt short; that verdict is
``layout.PromptSharing``'s (from ``costs.py``), which the update asks before it picks this layout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.forward.gather import select_cache_rows, take_rows
from slimgrpo.forward.packed import row_groups
from slimgrpo.forward.rows import CompletionRows, HiddenOut, completion_position_ids, hidden_layout, lm_head_spec


def shares_work(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int) -> int:
    """How many groups the rows form, where sharing saves work (some rows share a prompt) and the model
    can run it (no checkpointing, no FSDP2); 0 where it cannot or would not save work."""
    lm = unwrap_causal_lm(model)
    if any(getattr(m, "gradient_checkpointing", False) is True for m in lm.modules()):
        return 0
    if any(hasattr(m, "_fsdp_state") or "FSDP" in type(m).__name__ for m in lm.modules()):
        return 0  # FSDP2: each layer would run forward twice before one backward (untested)
    P = input_ids.shape[1] - num_completion_tokens
    if P < 1 or input_ids.shape[0] < 2:
        return 0
    first_row, _ = row_groups(input_ids[:, :P], attention_mask[:, :P])
    return first_row.numel() if first_row.numel() < input_ids.shape[0] else 0


@hidden_layout
def shared_completion_hidden(model: nn.Module, x: CompletionRows) -> HiddenOut:
    """Same contract as ``logprobs.completion_hidden``, with each group's prompt run once."""
    input_ids, attention_mask, T = x.input_ids, x.attention_mask, x.T
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
    select_cache_rows(cache, group_of_row)  # K, V [groups] -> [rows]; backward sums per group, in order
    comp_out = decoder(input_ids=input_ids[:, P:], attention_mask=attention_mask,
                       position_ids=positions[:, P:], past_key_values=cache, use_cache=True)
    first = take_rows(last_prompt, group_of_row)[:, None]  # [rows, 1, H]: repeats summed in order in backward
    hidden = torch.cat([first, comp_out[0][:, :-1]], dim=1)  # [rows, T, H]
    mask = x.mask
    return hidden[mask], x.completion_ids[mask], mask, lm_head_spec(lm)


__all__ = ["shares_work", "shared_completion_hidden"]
