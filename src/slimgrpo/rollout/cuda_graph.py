"""Static-shape decode steps, replayed as CUDA graphs.

A decode step of a small model at a small batch is bound by kernel launches, not by the GPU: each
layer issues a dozen small kernels, and Python issues them one by one. A CUDA graph records the
kernels of one step once and replays them with a single launch. Recording needs every step to have
the same shapes and no host synchronisation, which ``LlamaStepper`` (llama_stepper.py) does not offer: it
slices its KV buffer and mask to the current length and keeps the step counter in Python.

:class:`StaticCacheStepper` is the same lean Llama-family step over a **static** cache:

* attention always reads the whole KV buffer ``[B, kv_heads, L, d]``; columns not written yet hold zeros,
  are masked with ``-inf`` and unmasked (``index_fill_``) when written;
* the write column and the row positions are device tensors advanced in place, so the step touches
  no Python state;
* its tensors come from a :class:`~slimgrpo.rollout.graph_cache.GraphCache` (graph_cache.py). With a
  capturing cache (CUDA, kept by the engine across ``generate`` calls) B and L are bucketed, the first
  step of each (B, L) runs eagerly and is recorded, and every later step of that shape, in this call or
  a later one, is one ``replay()``; rows that leave the batch are gathered to the front of the same
  buffers and the step moves to the graph of the smaller bucket (recorded once) or stays padded.
  Without one (``graphs=False``, the CPU path the tests compare) the buffers are sized exactly for the
  call and the step runs eagerly.

Reading the whole buffer costs some extra attention work for short prefixes; at the batch sizes of
GRPO rollouts the weights dominate each step's memory traffic, so the launch savings win. The
results equal the dynamic path's up to floating-point summation order (greedy tokens are compared in
tests/rollout/test_cuda_graph.py on CPU, with graphs off and with a stand-in recorder, and in tests/distributed/test_cuda.py on
CUDA).

Opt-in until it has been measured on a GPU: ``SLIMGRPO_CUDA_GRAPHS=1`` makes ``TorchRolloutEngine`` keep a
capturing cache for CUDA models (see :func:`enabled`).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from slimgrpo.runspec.run import CUDA_GRAPHS_ENV, cuda_graphs_asked

from .graph_cache import CudaGraphBackend, GraphCache, Slot, reads_call_tensors
from .llama_stepper import LlamaStepper, release_prefill_layer
from .model_parts import CausalLMParts

ENV = CUDA_GRAPHS_ENV


def enabled(device: torch.device) -> bool:
    """Use :class:`StaticCacheStepper` with graphs for this device? CUDA and ``SLIMGRPO_CUDA_GRAPHS=1`` (the rule
    the run spec reads too, so the plan holds the arena these graphs keep)."""
    return device.type == "cuda" and cuda_graphs_asked()


def cuda_graph_cache(device: torch.device, max_graphs: int | None = None) -> GraphCache:
    """A capturing cache for ``device`` (what ``TorchRolloutEngine`` keeps while ``enabled``)."""
    if device.type != "cuda":
        raise ValueError("CUDA graphs need a CUDA device")
    kw = {} if max_graphs is None else {"max_graphs": max_graphs}
    return GraphCache(CudaGraphBackend(device), **kw)


class StaticCacheStepper(LlamaStepper):
    """Lean Llama-family decode over a static KV cache, optionally replayed as a CUDA graph.

    ``graphs``: a :class:`GraphCache` to take the static tensors (and graphs) from; ``True`` = a capturing
    cache for this call only (CUDA); ``False`` = exact-size buffers for this call, run eagerly.
    """

    def __init__(self, parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int,
                 graphs: bool | GraphCache = False) -> None:
        device = prompt_mask.device
        if graphs is True:
            graphs = cuda_graph_cache(device)
        store = graphs if isinstance(graphs, GraphCache) else GraphCache(exact=True)
        # Not LlamaStepper.__init__: the buffers come from ``store``; its layer reading, _rope and _mlp are shared.
        self._read_layers(parts, prompt_mask)
        self.store = store
        n, P = prompt_mask.shape
        config = parts.config.get_text_config() if hasattr(parts.config, "get_text_config") else parts.config
        self.hidden = config.hidden_size
        self.captures = 0  # graphs this stepper recorded (for tests and metrics)
        store.bind(parts)
        # Weights made for this call only (CPU packing) must not be recorded: their memory is freed after it.
        self.graphs = store.backend is not None and not reads_call_tensors(parts)

        k0 = cache.layers[0].keys  # [n, kv_heads, P, head_dim]
        length = store.length_for(P + max_new)
        rows = store.rows_for(n, length)
        self.arena = store.arena(parts, len(self.layers), k0.shape[1], k0.shape[3], k0.dtype, device, rows, length)
        rows = store.rows_for(n, length)  # again: growing the arena drops the slots (it is large enough for these)
        del k0
        self.slot = s = store.slot(rows, length, self.hidden)
        for i in range(len(self.layers)):
            for buf, src in ((s.keys[i], cache.layers[i].keys), (s.values[i], cache.layers[i].values)):
                buf[:n, :, :P] = src
                # Attention reads every column: unwritten ones (and padding rows) must be finite (0 * NaN is NaN).
                buf[:n, :, P:].zero_()
                buf[n:].zero_()
            release_prefill_layer(cache, i)  # the prompt's keys and values are never held twice
        s.mask.zero_()  # padding rows attend to every (finite) column: no all -inf row
        s.mask[:n, 0, 0, :P].masked_fill_(~prompt_mask.bool(), float("-inf"))  # left padding
        s.mask[:n, :, :, P:] = float("-inf")  # not written yet
        s.next_pos.zero_()  # padding rows: positions stay inside the rotary tables
        s.next_pos[:n] = prompt_mask.sum(-1)
        s.col.fill_(P)

    def step_rows(self, rows: int) -> int:
        """Rows one step computes for a batch of ``rows`` (its padded size): the engine drops finished rows
        only when that makes the step smaller."""
        return self.store.rows_for(rows, self.slot.length)

    def _static_step(self, s: Slot) -> torch.Tensor:
        b, d = s.rows, self.head_dim
        cos = self.arena.cos[s.next_pos][:, None]  # [b, 1, d]
        sin_signed = self.arena.sin_signed[s.next_pos][:, None]
        s.mask.index_fill_(3, s.col, 0.0)  # the column written below becomes visible
        x = self.parts.decoder.embed_tokens(s.tokens)  # [b, H]
        linear = self.parts.linear
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = linear(attn.q_proj, h).view(b, -1, d)
            k = linear(attn.k_proj, h).view(b, -1, d)
            v = linear(attn.v_proj, h).view(b, -1, d)
            if self.has_qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self._rope(q, cos, sin_signed), self._rope(k, cos, sin_signed)
            s.keys[i].index_copy_(2, s.col, k.unsqueeze(2))
            s.values[i].index_copy_(2, s.col, v.unsqueeze(2))
            q = q.view(b, k.shape[1], -1, d)
            out = F.scaled_dot_product_attention(q, s.keys[i], s.values[i], attn_mask=s.mask, scale=self.scaling)
            x = x + linear(attn.o_proj, out.reshape(b, -1))
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x))
        s.next_pos.add_(1)
        s.col.add_(1)
        return self.parts.decoder.norm(x)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape[0], self.slot
        s.tokens[:b].copy_(tokens)  # padding rows keep earlier (valid) ids
        self.t += 1
        if not self.graphs:
            return self._static_step(s)[:b]
        if s.graph is not None:
            s.graph.replay()
            return s.out[:b]

        def body(slot: Slot = s) -> None:
            slot.out.copy_(self._static_step(slot))

        if self.store.record(s, body):  # runs this step once (the warm-up), then records it
            self.captures += 1
        else:  # the step could not be recorded (the cache said why): this and later steps run eagerly
            self.graphs = False
        return s.out[:b]

    def select(self, keep: torch.Tensor) -> None:
        b, old = keep.numel(), self.slot
        rows = self.store.rows_for(b, old.length)
        new = old if rows == old.rows else self.store.slot(rows, old.length, self.hidden, current=old)
        for i in range(len(self.layers)):
            # Both slots view the same arena memory: the gather copies the kept rows out before they land.
            new.keys[i][:b] = old.keys[i][keep]
            new.values[i][:b] = old.values[i][keep]
        mask, pos = old.mask[keep], old.next_pos[keep]
        new.mask[b:].zero_()
        new.next_pos[b:].zero_()
        new.mask[:b], new.next_pos[:b] = mask, pos
        if new is not old:
            new.col.copy_(old.col)
        self.slot = new


def make_static_stepper(parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int,
                        graphs: bool | GraphCache | None = None) -> StaticCacheStepper:
    """A :class:`StaticCacheStepper`; ``graphs`` None = a capturing cache for this call on CUDA devices."""
    if graphs is None:
        graphs = prompt_mask.device.type == "cuda"
    return StaticCacheStepper(parts, cache, prompt_mask, max_new, graphs=graphs)


__all__ = ["ENV", "StaticCacheStepper", "cuda_graph_cache", "enabled", "make_static_stepper"]
