"""One decode step for a batch of rows: ``make_stepper`` picks the generic Hugging Face path or a lean one.

Every stepper starts from the KV cache that the prefill left in a ``DynamicCache`` (already fanned out
to one row per completion) and offers the same two operations:

    hidden = stepper.step(tokens)      # tokens [b] -> last hidden state [b, H] (after the final norm)
    stepper.select(keep)               # keep only these batch slots (finished rows leave)

``HFStepper`` (here) calls the model's own decoder forward: it works for every architecture, but each call
rebuilds the attention mask and rotary tables and grows the cache with ``torch.cat``.

The lean steppers are built on ``LlamaStepper`` (llama_stepper.py, Llama-shaped models): its quantised-cache
variant (kv_quant.py) and its static-cache / CUDA-graph variant (cuda_graph.py). They import the base from
its own module and this one imports them: no circle.
"""

from __future__ import annotations

import torch

from slimgrpo.forward.gather import select_cache_rows

from . import cuda_graph
from .graph_cache import GraphCache
from .kv_quant import make_quant_stepper
from .llama_stepper import LlamaStepper
from .model_parts import CausalLMParts


class HFStepper:
    """Decode through ``decoder.forward`` with the Hugging Face cache (works for any causal LM)."""

    def __init__(self, parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int) -> None:
        n, P = prompt_mask.shape
        self.parts, self.cache, self.P = parts, cache, P
        self.attn = torch.zeros(n, P + max_new, dtype=torch.long, device=prompt_mask.device)  # [b, P+max_new]
        self.attn[:, :P] = prompt_mask
        self.next_pos = prompt_mask.sum(-1)  # [b] position id of each row's next token
        self.t = 0  # tokens fed so far

    def step_rows(self, rows: int) -> int:
        """Rows one step computes for a batch of ``rows``: all of them (no padded sizes here)."""
        return rows

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        end = self.P + self.t + 1
        self.attn[:, end - 1] = 1
        hidden = self.parts.decoder(
            input_ids=tokens[:, None], attention_mask=self.attn[:, :end], position_ids=self.next_pos[:, None],
            past_key_values=self.cache, use_cache=True,
        ).last_hidden_state[:, -1]  # [b, H]
        self.next_pos = self.next_pos + 1
        self.t += 1
        return hidden

    def select(self, keep: torch.Tensor) -> None:
        select_cache_rows(self.cache, keep)
        self.attn, self.next_pos = self.attn[keep], self.next_pos[keep]


def make_stepper(parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int, lean: bool | None,
                 kv_cache_dtype: str | None = None, graphs: GraphCache | None = None):
    """The lean stepper where it applies (unless ``lean`` is False), else the generic one; a quantised
    KV cache (``kv_cache_dtype`` fp8_e4m3 / int8, see ``kv_quant``) needs the lean stepper. With ``graphs``
    (a cache the caller keeps across calls: CUDA graphs, opt-in, see ``cuda_graph.enabled``) the lean
    stepper is the static-cache one replaying them. A lean stepper takes the prompt's keys and values out
    of ``cache`` (its layers are left empty): do not reuse it."""
    total = prompt_mask.shape[1] + max_new
    if kv_cache_dtype not in (None, "auto"):
        return make_quant_stepper(parts, cache, prompt_mask, max_new, lean, kv_cache_dtype)
    if lean is not False and LlamaStepper.supports(parts, total):
        if graphs is not None:
            return cuda_graph.StaticCacheStepper(parts, cache, prompt_mask, max_new, graphs=graphs)
        return LlamaStepper(parts, cache, prompt_mask, max_new)
    if lean:
        raise ValueError(f"lean decoding does not support {type(parts.base).__name__}; use lean_decode=None")
    return HFStepper(parts, cache, prompt_mask, max_new)


__all__ = ["HFStepper", "LlamaStepper", "make_stepper"]
