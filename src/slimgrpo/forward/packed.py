"""Completion hidden states of a whole micro-batch packed into one sequence: no padding, each prompt once.

Both other layouts of the update pay for padding: the unpadded one (``unpadded.py``) right-pads every
row to the longest ``prompt + completion``, and the shared-prompt one (``shared_prompt.py``) pads
every completion to the longest completion. When completion lengths vary a lot (a real model that
stops at EOS: most rows end after a few tokens, one rambles to the limit) most of those positions are
padding. Here only real tokens go through the decoder::

    [ prompt g0 | prompt g1 | completion r0 | completion r1 | ... ]          one row, N real tokens

with a block mask: a prompt token sees the earlier tokens of its prompt; a completion token sees its
group's prompt and the earlier tokens of its own completion. Positions restart per document (a
completion continues its prompt's positions), so every token gets the position, keys and values it has
in the padded layout, and the hidden states equal the plain path's up to summation order.

The price is attention over an ``N x N`` mask (the kernel computes every pair), so this layout is only
chosen where the estimated work (linear layers per token + attention per pair) is below that of the layout
the update would otherwise use (``cheaper``), and the mask stays small (``MAX_TOKENS``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.families import llama_like
from slimgrpo.forward.gather import take_rows
from slimgrpo.forward.rows import CompletionRows, HiddenOut, hidden_layout, lm_head_spec

MAX_TOKENS = 4096  # packed length limit: the [N, N] bool mask is at most 16 MiB


def row_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(first_row [groups], group_of_row [rows])``: runs of adjacent rows with the same prompt ids and mask."""
    rows = prompt_ids.shape[0]
    same = torch.zeros(rows, dtype=torch.bool, device=prompt_ids.device)
    if rows > 1:
        same[1:] = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)
    return (~same).nonzero().squeeze(1), torch.cumsum(~same, 0) - 1


def _lengths(attention_mask: Tensor, T: int) -> tuple[Tensor, Tensor] | None:
    """``(prompt_len [rows], completion_len [rows])`` when prompts are left-padded and completions
    right-padded (the layout the rollout produces); None for any other layout."""
    am = attention_mask.bool()
    P = am.shape[1] - T
    p_len, c_len = am[:, :P].sum(1), am[:, P:].sum(1)
    cols_p = torch.arange(P, device=am.device)
    cols_c = torch.arange(T, device=am.device)
    if not torch.equal(am[:, :P], cols_p >= (P - p_len)[:, None]) or not torch.equal(am[:, P:], cols_c < c_len[:, None]):
        return None
    return p_len, c_len


def _layer_flops(config) -> tuple[float, float]:
    """``(per token, per attention pair)`` FLOPs of one decoder layer's forward."""
    h, i = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = getattr(config, "num_key_value_heads", heads) * head_dim
    per_token = 2.0 * (h * heads * head_dim * 2 + 2 * h * kv + 3 * h * i)
    return per_token, 4.0 * heads * head_dim


def cheaper(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, T: int, shared_groups: int) -> bool:
    """Packing applies (a Llama-shaped decoder on sdpa / eager attention, the rollout's padding layout,
    at most ``MAX_TOKENS`` real tokens) and its estimated work is below the unpadded layout's and, when
    ``shared_groups`` > 0 (the rows form that many groups and the shared-prompt layout can run), below
    that one's as well."""
    lm = unwrap_causal_lm(model)
    config = lm.config
    if not llama_like(getattr(config, "model_type", None)) or getattr(config, "sliding_window", None):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return False  # the block mask is full attention; a sliding-window layer would see too much
    if (getattr(config, "_attn_implementation", None) or "sdpa") not in ("sdpa", "eager"):
        return False
    lengths = _lengths(attention_mask, T)
    if lengths is None or input_ids.shape[0] < 2:
        return False
    p_len, c_len = lengths
    first_row, _ = row_groups(input_ids[:, : input_ids.shape[1] - T], attention_mask[:, : input_ids.shape[1] - T])
    n = int(p_len[first_row].sum()) + int(c_len.sum())
    if n > MAX_TOKENS or bool((p_len < 1).any()):
        return False
    per_token, per_pair = _layer_flops(config)
    rows, P = input_ids.shape[0], input_ids.shape[1] - T
    packed = n * per_token + n * n * per_pair
    L = int((p_len + c_len).max())
    best_other = rows * L * per_token + rows * L * L / 2 * per_pair  # unpadded rows under a causal kernel
    if shared_groups:
        fan_out = (shared_groups * P + rows * T) * per_token + (shared_groups * P * P / 2 + rows * T * (P + T)) * per_pair
        best_other = min(best_other, fan_out)
    return packed < best_other


@hidden_layout
def packed_completion_hidden(model: nn.Module, x: CompletionRows) -> HiddenOut:
    """``logprobs.completion_hidden``'s contract (padded rows in; ``(hidden [n, H], targets [n], mask
    [rows, T], head)`` out), computed on the micro-batch packed into one sequence (module docstring)."""
    input_ids, attention_mask, T, completion_ids = x.input_ids, x.attention_mask, x.T, x.completion_ids
    lengths = _lengths(attention_mask, T)
    if lengths is None:
        raise ValueError("packing needs left-padded prompts and right-padded completions")
    p_len, c_len = lengths
    lm = unwrap_causal_lm(model)
    device = input_ids.device
    rows, P = input_ids.shape[0], input_ids.shape[1] - T
    first_row, group_of_row = row_groups(input_ids[:, :P], attention_mask[:, :P])
    mask = x.mask
    if bool((mask & ~attention_mask[:, P:].bool()).any()):
        raise ValueError("completion_mask marks tokens outside the completions")

    # Source (row, column), position, group and owner row (-1 = prompt) of every packed token.
    src_row, src_col, pos, grp, owner = [], [], [], [], []
    prompt_last = []  # packed index of each group's last prompt token
    offset = 0  # packed tokens so far
    for g, r in enumerate(first_row.tolist()):
        n = int(p_len[r])
        src_row.append(torch.full((n,), r)), src_col.append(torch.arange(P - n, P)), pos.append(torch.arange(n))
        grp.append(torch.full((n,), g)), owner.append(torch.full((n,), -1))
        offset += n
        prompt_last.append(offset - 1)
    completion_start = []
    for r in range(rows):
        g, n = int(group_of_row[r]), int(c_len[r])
        completion_start.append(offset)
        offset += n
        src_row.append(torch.full((n,), r)), src_col.append(torch.arange(P, P + n))
        pos.append(int(p_len[first_row[g]]) + torch.arange(n))
        grp.append(torch.full((n,), g)), owner.append(torch.full((n,), r))
    src_row, src_col, pos, grp, owner = (torch.cat(x).to(device) for x in (src_row, src_col, pos, grp, owner))
    N = src_row.numel()
    ids = input_ids[src_row, src_col][None]  # [1, N]
    causal = torch.ones(N, N, dtype=torch.bool, device=device).tril()
    same_doc = (grp[:, None] == grp[None, :]) & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None]))
    allowed = (causal & same_doc)[None, None]  # [1, 1, N, N]
    if (getattr(lm.config, "_attn_implementation", None) or "sdpa") == "eager":
        dtype = next(lm.parameters()).dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    hidden = lm.get_decoder()(input_ids=ids, attention_mask=allowed, position_ids=pos[None], use_cache=False)[0][0]

    # Completion token t of row r is predicted by the hidden state before it: its group's last prompt
    # token for t = 0, else its own token t - 1.
    t = torch.arange(T, device=device)
    starts = torch.tensor(completion_start, device=device)
    before = torch.where(t[None] == 0, torch.tensor(prompt_last, device=device)[group_of_row][:, None],
                         starts[:, None] + t[None] - 1)  # [rows, T]
    return take_rows(hidden, before[mask]), completion_ids[mask], mask, lm_head_spec(lm)  # repeats: gather.py
