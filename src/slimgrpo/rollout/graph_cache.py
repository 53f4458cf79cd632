"""The CUDA graphs of the static-cache decode step, kept across ``generate`` calls (see cuda_graph.py).

A CUDA graph replays kernels against the addresses it was recorded with. So a graph of one decode step
can be reused only while every tensor it reads or writes stays where it was: the KV buffers, the mask,
the positions, the token input, the output, the rotary tables, and the model's weights. This module owns
those static tensors, so that a graph recorded in one ``generate`` call is replayed in the next:

* **Keys.** One graph per (batch rows, KV length): rows rounded up by :func:`batch_bucket` (1, 2, 4, 8,
  then multiples of 8) and the KV length (prompt + ``max_new_tokens``) by :func:`length_bucket` (multiples
  of :data:`LENGTH_BUCKET`). A batch that is not a bucket size runs padded: the padding rows compute
  (row-wise, nothing mixes rows) and their outputs are ignored.
* **One KV arena.** Every graph's KV buffers are views of one buffer per layer (keys and values), sized
  for the largest (rows, length) seen. Only one generate runs at a time, so graphs of different keys can
  share it; when rows leave the batch, the survivors are gathered in place to the front of the same
  memory. The arena grows when a call needs more (then every graph is dropped: their addresses are gone).
* **One memory pool.** The graphs share one private CUDA memory pool (``graph_pool_handle``): a step's
  temporaries are reused from graph to graph, so the pool holds about one step's activations, not one
  per graph. Sharing is safe because graphs never run concurrently and each step's output is consumed
  (the LM head) before the next replay.
* **Bound.** At most ``max_graphs`` graphs (default 32) are kept, least recently used dropped first; when
  the bound is reached a batch runs padded in the next larger captured graph of its length instead of
  recording a new one. Memory held between calls: the arena (the KV cache of the largest call, rounded up
  to the buckets: what the dynamic stepper allocates for that call), the pool, and per graph its small
  static tensors (mask ``[B, L]``, positions, tokens, output ``[B, H]``). ``release()`` frees it all.
* **No allocator flushes.** Captures call ``CUDAGraph.capture_begin/capture_end`` on a side stream into
  the shared pool; ``torch.cuda.graph`` would synchronise the device and empty the caching allocators
  (device and pinned host) before every capture.

What invalidates the graphs (checked at the start of each stepper, :meth:`GraphCache.bind`): a parameter or
buffer of the decoder replaced by another tensor (``load_state_dict(assign=True)``, ``.to()``, a new
model), LoRA adapters switched, enabled/disabled, merged/unmerged or rescaled (peft's forward branches on
these in Python, and a graph replays the branch it recorded). An optimizer step or any other update **in
place** keeps the addresses, so the graphs read the new weights: nothing to do. Weights the engine builds
per call (CPU oneDNN packing, merged LoRA weights: ``CausalLMParts.packed``) would be freed after the call,
so the decoder then runs without graphs (:func:`reads_call_tensors`); on CUDA nothing is packed.

The capture mechanism is behind :class:`GraphBackend`, so the tests run the whole cache on CPU with a
stand-in that counts captures and replays by calling the step.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from .model_parts import CausalLMParts

LENGTH_BUCKET = 256  # KV lengths are rounded up to a multiple of this (attention reads the whole bucket)
MAX_GRAPHS = 32


def batch_bucket(rows: int) -> int:
    """Rows a graph is recorded for: 1, 2, 4, 8, then the next multiple of 8 (at most 7 padding rows)."""
    if rows <= 8:
        return 1 << max(rows - 1, 0).bit_length()
    return -(-rows // 8) * 8


def length_bucket(total: int) -> int:
    """KV columns a graph is recorded for: ``total`` rounded up to a multiple of :data:`LENGTH_BUCKET`."""
    return -(-total // LENGTH_BUCKET) * LENGTH_BUCKET


class Graph(Protocol):
    def replay(self) -> None:
        """Run the recorded work again."""


class GraphBackend(Protocol):
    """How steps are recorded and warmed up (``CudaGraphBackend``; tests pass a counting stand-in)."""

    def run(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once, now (the warm-up before a capture)."""

    def capture(self, fn: Callable[[], None]) -> Graph:
        """Record ``fn``'s work without running it; ``replay()`` runs it."""


class CudaGraphBackend:
    """Records on a side stream into one shared memory pool; never empties the caching allocators."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.pool = torch.cuda.graph_pool_handle()

    def _on_side_stream(self, body: Callable[[], object]) -> object:
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            out = body()
        main.wait_stream(self.stream)
        return out

    def run(self, fn: Callable[[], None]) -> None:
        # Lazy library state (cuBLAS workspaces, kernel selection) is set up here, outside the capture.
        self._on_side_stream(fn)

    def capture(self, fn: Callable[[], None]) -> Graph:
        graph = torch.cuda.CUDAGraph()

        def record() -> None:
            # thread_local: a CUDA call another thread makes meanwhile (a reward model's thread, NCCL's watchdog)
            # neither joins nor spoils this capture, as it would under the default global mode
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                fn()
            finally:
                graph.capture_end()

        self._on_side_stream(record)
        return graph


@dataclass(eq=False)
class Slot:
    """The static tensors one graph reads and writes, for one (rows, length) key."""

    rows: int
    length: int
    keys: list[torch.Tensor]  # per layer [rows, kv_heads, length, head_dim]: views of the arena
    values: list[torch.Tensor]
    mask: torch.Tensor  # [rows, 1, 1, length] additive
    next_pos: torch.Tensor  # [rows] position of each row's next token
    col: torch.Tensor  # [1] the KV column the next step writes
    tokens: torch.Tensor  # [rows] the step's input
    out: torch.Tensor  # [rows, hidden] the step's output
    graph: Graph | None = None


@dataclass(eq=False)
class _Arena:
    """KV memory shared by every slot: one flat buffer per layer for keys and one for values, plus the
    rotary tables for ``length`` positions."""

    geometry: tuple  # (layers, kv_heads, head_dim, dtype, device)
    numel: int
    length: int
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    cos: torch.Tensor | None = None
    sin_signed: torch.Tensor | None = None


class GraphCache:
    """Static decode tensors and their graphs, by (rows, KV length) (see the module docstring).

    Args:
        backend: records and warms up steps; None = no graphs (the static stepper runs eagerly).
        max_graphs: most slots (graphs) kept; least recently used dropped first.
        exact: size slots exactly (no buckets): the eager static stepper of one call (``make_static_stepper``).
    """

    def __init__(self, backend: GraphBackend | None = None, max_graphs: int = MAX_GRAPHS, exact: bool = False) -> None:
        if not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be a positive int, got {max_graphs!r}")
        self.backend, self.max_graphs, self.exact = backend, max_graphs, exact
        self._slots: OrderedDict[tuple[int, int], Slot] = OrderedDict()
        self._arena: _Arena | None = None
        self._fingerprint: tuple | None = None
        self.captures = 0  # graphs recorded over the cache's life
        self.invalidations = 0  # times every graph was dropped (weights replaced, arena grown)
        self.failure: str | None = None  # why recording was given up, if it was

    # ------------------------------------------------------------------ keys
    def length_for(self, total: int) -> int:
        return total if self.exact else length_bucket(total)

    def rows_for(self, rows: int, length: int) -> int:
        """Rows of the slot a batch of ``rows`` runs in: its bucket, or, with ``max_graphs`` slots held and
        none for the bucket, the smallest held slot of this length that is large enough."""
        if self.exact:
            return rows
        want = batch_bucket(rows)
        if (want, length) in self._slots or len(self._slots) < self.max_graphs:
            return want
        held = sorted(r for r, l in self._slots if l == length and r >= want)
        return held[0] if held else want

    @property
    def graphs(self) -> int:
        return sum(s.graph is not None for s in self._slots.values())

    def keys(self) -> list[tuple[int, int]]:
        return list(self._slots)

    def nbytes(self) -> int:
        """Bytes the cache holds between calls (the arena and every slot's tensors; not the graph pool)."""
        total = 0
        if self._arena is not None:
            a = self._arena
            total += sum(t.numel() * t.element_size() for t in (*a.keys, *a.values, a.cos, a.sin_signed))
        for s in self._slots.values():
            total += sum(t.numel() * t.element_size() for t in (s.mask, s.next_pos, s.col, s.tokens, s.out))
        return total

    # ------------------------------------------------------------------ validity
    def bind(self, parts: CausalLMParts) -> None:
        """Drop every graph if the decoder's tensors or adapter state changed since the last call."""
        fingerprint = decoder_fingerprint(parts)
        if fingerprint != self._fingerprint:
            if self._slots:
                self.invalidations += 1
            self._slots.clear()
            if self._fingerprint is not None and self._fingerprint[0] is not fingerprint[0]:
                self._arena = None  # another model: its rotary tables may differ
            self._fingerprint = fingerprint

    def release(self) -> None:
        """Free the graphs, their static tensors and the KV arena."""
        self._slots.clear()
        self._arena = None
        self._fingerprint = None

    # ------------------------------------------------------------------ storage
    def arena(self, parts: CausalLMParts, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              device: torch.device, rows: int, length: int) -> _Arena:
        """The KV arena, grown (every graph dropped) when it is too small for (rows, length)."""
        geometry = (layers, kv_heads, head_dim, dtype, device)
        numel = rows * kv_heads * length * head_dim
        a = self._arena
        if a is not None and a.geometry == geometry and a.numel >= numel and a.length >= length:
            return a
        if a is not None and a.geometry == geometry:  # grow: keep the larger of each dimension
            numel, length = max(numel, a.numel), max(length, a.length)
        if self._slots:
            self.invalidations += 1
        self._slots.clear()
        self._arena = None  # free the old one before allocating the new
        a = _Arena(geometry, numel, length)
        for _ in range(layers):
            a.keys.append(torch.zeros(numel, dtype=dtype, device=device))
            a.values.append(torch.zeros(numel, dtype=dtype, device=device))
        positions = torch.arange(length, device=device)[None]
        probe = torch.zeros(1, 1, 1, dtype=dtype, device=device)
        cos, sin = parts.decoder.rotary_emb(probe, positions)  # [1, length, head_dim] each
        half = head_dim // 2
        a.cos = cos[0]
        a.sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)  # sin with rotate_half's sign
        self._arena = a
        return a

    def slot(self, rows: int, length: int, hidden: int, current: Slot | None = None) -> Slot:
        """The slot for (rows, length), made if missing (least recently used dropped past ``max_graphs``,
        never ``current``, the slot the caller is moving its rows out of)."""
        key = (rows, length)
        found = self._slots.get(key)
        if found is not None:
            self._slots.move_to_end(key)
            return found
        a = self._arena
        assert a is not None and a.length >= length, "arena() first"
        _, kv_heads, head_dim, dtype, device = a.geometry
        n = rows * kv_heads * length * head_dim
        assert n <= a.numel
        view = lambda flat: flat[:n].view(rows, kv_heads, length, head_dim)  # noqa: E731
        s = Slot(rows, length, [view(k) for k in a.keys], [view(v) for v in a.values],
                 mask=torch.zeros(rows, 1, 1, length, dtype=dtype, device=device),
                 next_pos=torch.zeros(rows, dtype=torch.long, device=device),
                 col=torch.zeros(1, dtype=torch.long, device=device),
                 tokens=torch.zeros(rows, dtype=torch.long, device=device),
                 out=torch.zeros(rows, hidden, dtype=dtype, device=device))
        while len(self._slots) >= self.max_graphs:
            old = next((k for k, v in self._slots.items() if v is not current), None)
            if old is None:
                break
            del self._slots[old]
        self._slots[key] = s
        return s

    def record(self, slot: Slot, fn: Callable[[], None]) -> bool:
        """Run ``fn`` once (the warm-up: the step happens) and record it as ``slot``'s graph (not run
        again). False if the recording failed (a module that synchronises with the host, say): the cache
        then records nothing more and every step runs eagerly; the reason is in ``failure``."""
        assert self.backend is not None
        self.backend.run(fn)
        try:
            slot.graph = self.backend.capture(fn)
        except RuntimeError as err:
            self.backend, self.failure = None, f"{type(err).__name__}: {err}"
            warnings.warn(f"the decode step could not be recorded as a CUDA graph; decoding without graphs "
                          f"({self.failure})", RuntimeWarning, stacklevel=3)
            return False
        self.captures += 1
        return True


def reads_call_tensors(parts: CausalLMParts) -> bool:
    """True while the decoder's products go through weights made for one call (CPU packing, merged LoRA:
    ``CausalLMParts.packed_weights``): a graph would keep their addresses after they are freed."""
    return bool(parts.fused) or bool(parts.merged) or any(m is not parts.lm_head for m in parts.packed)


def decoder_fingerprint(parts: CausalLMParts) -> tuple:
    """What a recorded decode step depends on besides values: every decoder tensor's address, shape and
    dtype, and each adapter layer's Python-side state (peft's forward branches on it)."""
    decoder = parts.decoder
    tensors = tuple((name, t.data_ptr(), tuple(t.shape), t.dtype)
                    for name, t in (*decoder.named_parameters(), *decoder.named_buffers()))
    adapters = []
    for name, m in decoder.named_modules():
        if hasattr(m, "lora_A"):
            adapters.append((name, tuple(getattr(m, "active_adapters", ()) or ()),
                             tuple(getattr(m, "merged_adapters", ()) or ()),
                             bool(getattr(m, "disable_adapters", False)),
                             tuple(sorted((getattr(m, "scaling", {}) or {}).items()))))
    return parts.decoder, tensors, tuple(adapters)


__all__ = ["CudaGraphBackend", "GraphBackend", "GraphCache", "LENGTH_BUCKET", "MAX_GRAPHS", "Slot",
           "batch_bucket", "decoder_fingerprint", "length_bucket", "reads_call_tensors"]
