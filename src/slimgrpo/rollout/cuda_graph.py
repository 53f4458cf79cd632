"""Static-shape decode steps, replayed as CUDA graphs.

A decode step of a small model at a small batch is bound by kernel launches, not by the GPU: each
layer issues a dozen small kernels, and Python issues them one by one. A CUDA graph records the
kernels of one step once and replays them with a single launch. Recording needs every step to have
the same shapes and no host synchronisation, which ``LlamaStepper`` (llama_stepper.py) does not offer: it
slices its KV buffer and mask to the current length and keeps the step counter in Python.

:class:`StaticCacheStepper` is the same lean Llama-family step over a **static** cache:

* attention always reads the whole preallocated buffer ``[b, kv_heads, P + max_new, d]``; columns
  not written yet hold zeros, are masked with ``-inf`` and unmasked (``index_fill_``) when written;
* the write column and the row positions are device tensors advanced in place, so the step touches
  no Python state;
* with ``graphs=True`` (CUDA only) the first steps after each (re)build run eagerly on a side stream
  (warm-up), then one step is captured and every later step is a ``graph.replay()``; dropping
  finished rows (``select``) changes the batch size and so discards the graph, which is re-captured.

Reading the whole buffer costs some extra attention work for short prefixes; at the batch sizes of
GRPO rollouts the weights dominate each step's memory traffic, so the launch savings win. The
results equal the dynamic path's up to floating-point summation order (greedy tokens are compared in
tests/test_cuda_graph.py on CPU, with graphs off, and in tests/test_cuda.py on CUDA).

Opt-in until it has been measured on a GPU: ``SLIMGRPO_CUDA_GRAPHS=1`` makes ``decode.make_stepper``
pick it for CUDA models (see :func:`enabled`).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .llama_stepper import LlamaStepper
from .model_parts import CausalLMParts

ENV = "SLIMGRPO_CUDA_GRAPHS"


def enabled(device: torch.device) -> bool:
    """Use :class:`StaticCacheStepper` with graphs for this device? CUDA and ``SLIMGRPO_CUDA_GRAPHS=1``."""
    return device.type == "cuda" and os.environ.get(ENV, "0") not in ("", "0", "false", "no")


class StaticCacheStepper(LlamaStepper):
    """Lean Llama-family decode over a static KV cache, optionally replayed as a CUDA graph."""

    def __init__(self, parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int,
                 graphs: bool = False, warmup_steps: int = 2) -> None:
        super().__init__(parts, cache, prompt_mask, max_new)
        if graphs and prompt_mask.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.mask[:, :, :, self.P:] = float("-inf")  # not written yet
        for buf in (*self.keys, *self.values):
            # Attention reads every column: unwritten ones must hold finite values (0 * NaN is NaN).
            buf[:, :, self.P:].zero_()
        self.col = torch.tensor([self.P], dtype=torch.long, device=prompt_mask.device)  # next KV column
        self.next_pos = self.next_pos.clone()
        self.graphs, self.warmup_steps = graphs, warmup_steps
        self.captures = 0  # graphs recorded (for tests and metrics)
        self._reset_graph()

    def _reset_graph(self) -> None:
        self._graph = None
        self._tokens = self._out = None
        self._eager_left = self.warmup_steps

    def _static_step(self, tokens: torch.Tensor) -> torch.Tensor:
        b, d = tokens.shape[0], self.head_dim
        cos = self.cos[self.next_pos][:, None]  # [b, 1, d]
        sin_signed = self.sin_signed[self.next_pos][:, None]
        self.mask.index_fill_(3, self.col, 0.0)  # the column written below becomes visible
        x = self.parts.decoder.embed_tokens(tokens)  # [b, H]
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
            self.keys[i].index_copy_(2, self.col, k.unsqueeze(2))
            self.values[i].index_copy_(2, self.col, v.unsqueeze(2))
            q = q.view(b, k.shape[1], -1, d)
            out = F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=self.mask,
                                                 scale=self.scaling)
            x = x + linear(attn.o_proj, out.reshape(b, -1))
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x))
        self.next_pos.add_(1)
        self.col.add_(1)
        return self.parts.decoder.norm(x)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.t += 1
        if not self.graphs:
            return self._static_step(tokens)
        if self._graph is not None:
            self._tokens.copy_(tokens)
            self._graph.replay()
            return self._out
        # Warm-up: real steps on a side stream (lazy library initialisation happens here, not in capture).
        side = torch.cuda.Stream(device=tokens.device)
        side.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(side):
            out = self._static_step(tokens)
        torch.cuda.current_stream(tokens.device).wait_stream(side)
        self._eager_left -= 1
        if self._eager_left <= 0:
            # Recording does not run the kernels: the state is not advanced by the capture.
            self._tokens = tokens.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._out = self._static_step(self._tokens)
            self._graph = graph
            self.captures += 1
        return out

    def select(self, keep: torch.Tensor) -> None:
        super().select(keep)
        self.next_pos = self.next_pos.clone()
        self._reset_graph()  # new batch size: the recorded graph no longer applies


def make_static_stepper(parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int,
                        graphs: bool | None = None) -> StaticCacheStepper:
    """A :class:`StaticCacheStepper`; ``graphs`` None = on CUDA devices."""
    if graphs is None:
        graphs = prompt_mask.device.type == "cuda"
    return StaticCacheStepper(parts, cache, prompt_mask, max_new, graphs=graphs)


__all__ = ["ENV", "StaticCacheStepper", "enabled", "make_static_stepper"]
