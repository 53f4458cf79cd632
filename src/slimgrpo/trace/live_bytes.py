"""Live tensor bytes, by tag and by phase: a ``TorchDispatchMode`` that counts storages, not views.

    tracker = LiveBytes()
    with tracker:
        tracker.track_all(model.parameters(), "weights")   # tensors made before the mode started
        with tracker.phase("update"), tracker.tag("activations"):
            loss = model(x).sum()
        loss.backward()
    tracker.peak_bytes, tracker.phases["update"].by_tag

Every tensor an operator returns is looked up by its storage: a view, an in-place result or a
second output sharing a storage adds nothing; a new storage adds its ``nbytes()`` once, under the
tag in force when it was made, and is subtracted when the storage is freed (a weak reference on
the storage object, which PyTorch keeps unique per storage). The mode counts what PyTorch's
tensors hold, real or fake (``FakeTensorMode``), and nothing else: not the allocator's cache or
fragmentation, not workspaces libraries take outside PyTorch tensors, not the Python runtime.

Allocations made while autograd runs backward get the tag ``"backward"`` unless a tag is given
explicitly with :meth:`LiveBytes.tag` (``backward_tag=None`` turns that off). :meth:`retag` moves a
storage's bytes to another tag (e.g. a parameter's ``.grad`` once accumulated); a retag while the
total still equals the peak also moves them in the peak's breakdown. At every new peak of a phase
the per-tag totals are copied: ``phases[name].by_tag`` is the breakdown at that moment.

``host_tags`` name tags whose storages a run would hold in host memory, not on the device (a CUDA trace:
offloaded checkpoints, the full-fine-tuning reference copy). Their bytes are counted apart: ``host_bytes``
now, ``host_peak_bytes`` at most, ``host_by_tag``; they are not in ``total_bytes`` or the device peaks.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class PhasePeak:
    """The largest live total seen during one phase, and its breakdown by tag at that moment."""

    peak_bytes: int = 0
    by_tag: dict[str, int] = field(default_factory=dict)
    host_peak_bytes: int = 0  # largest live total of the host tags during the phase


class LiveBytes(TorchDispatchMode):
    """Counts live storage bytes per tag; see the module docstring."""

    def __init__(self, default_tag: str = "other", backward_tag: str | None = "backward",
                 host_tags: Iterable[str] = ()) -> None:
        super().__init__()
        self.host_tags = frozenset(host_tags)
        self.host_by_tag: dict[str, int] = {}  # live bytes per host tag, now
        self.host_bytes = 0  # live bytes of the host tags, now
        self.host_peak_bytes = 0
        self._live: dict[int, tuple[int, str, weakref.ref]] = {}  # storage address -> (nbytes, tag, ref)
        self.by_tag: dict[str, int] = {}  # live bytes per tag, now
        self.total_bytes = 0  # live bytes, now
        self.peak_bytes = 0  # largest total_bytes seen
        self.peak_by_tag: dict[str, int] = {}
        self.phases: dict[str, PhasePeak] = {}
        self._tags = [default_tag]
        self._explicit = [False]  # whether the innermost tag was given explicitly
        self._phase: str | None = None
        self.backward_tag = backward_tag

    # ------------------------------------------------------------------ contexts
    @contextlib.contextmanager
    def tag(self, name: str) -> Iterator[None]:
        """Tensors made inside get the tag ``name`` (also while autograd runs backward)."""
        self._tags.append(name)
        self._explicit.append(True)
        try:
            yield
        finally:
            self._tags.pop()
            self._explicit.pop()

    def set_tag(self, name: str) -> None:
        """Replace the innermost tag (for hooks that cannot hold a ``with`` block)."""
        self._tags[-1] = name

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Peaks inside are also recorded under ``phases[name]`` (phases do not nest)."""
        previous, self._phase = self._phase, name
        self.phases.setdefault(name, PhasePeak())
        self._note_peak()  # what is live when the phase starts counts towards its peak
        try:
            yield
        finally:
            self._phase = previous

    # ------------------------------------------------------------------ bookkeeping
    def current_tag(self) -> str:
        if self.backward_tag and not self._explicit[-1] and torch._C._current_graph_task_id() != -1:
            return self.backward_tag
        return self._tags[-1]

    def track(self, tensor: torch.Tensor, tag: str | None = None) -> None:
        """Count ``tensor``'s storage if it is new; with ``tag``, (re)tag it."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live:
            if tag is not None:
                self.retag(tensor, tag)
            return
        nbytes = int(storage.nbytes())
        tag = tag or self.current_tag()
        self._live[key] = (nbytes, tag, weakref.ref(storage, lambda _, k=key: self._free(k)))
        self._add(tag, nbytes)
        self._note_peak()

    def track_all(self, tensors: Iterable[torch.Tensor | None], tag: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track(t, tag)

    def retag(self, tensor: torch.Tensor, tag: str) -> None:
        """Move the bytes of ``tensor``'s storage to ``tag`` (tracking it first if needed)."""
        key = tensor.untyped_storage()._cdata
        if key not in self._live:
            self.track(tensor, tag)
            return
        nbytes, old, ref = self._live[key]
        if old == tag:
            return
        self._add(old, -nbytes)
        self._add(tag, nbytes)
        self._live[key] = (nbytes, tag, ref)
        if (old in self.host_tags) != (tag in self.host_tags):  # moved between host and device
            self._note_peak()
            return
        # Retagged at the peak itself (nothing freed since, e.g. a gradient just accumulated): the
        # peak's breakdown names it by its new tag too.
        peaks = [self.peak_by_tag] if self.total_bytes == self.peak_bytes else []
        if self._phase is not None and self.total_bytes == self.phases[self._phase].peak_bytes:
            peaks.append(self.phases[self._phase].by_tag)
        for by_tag in peaks:
            if by_tag.get(old, 0) >= nbytes:
                by_tag[old] -= nbytes
                by_tag[tag] = by_tag.get(tag, 0) + nbytes

    def live_bytes(self, tag: str | None = None) -> int:
        if tag is None:
            return self.total_bytes
        return self.host_by_tag.get(tag, 0) if tag in self.host_tags else self.by_tag.get(tag, 0)

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self._add(entry[1], -entry[0])

    def _add(self, tag: str, nbytes: int) -> None:
        """``nbytes`` (negative: freed) more under ``tag``, on the host or on the device by its tag."""
        if tag in self.host_tags:
            self.host_by_tag[tag] = self.host_by_tag.get(tag, 0) + nbytes
            self.host_bytes += nbytes
        else:
            self.by_tag[tag] = self.by_tag.get(tag, 0) + nbytes
            self.total_bytes += nbytes

    def _note_peak(self) -> None:
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        if self._phase is not None:
            p = self.phases[self._phase]
            p.host_peak_bytes = max(p.host_peak_bytes, self.host_bytes)
        if self.total_bytes > self.peak_bytes:
            self.peak_bytes = self.total_bytes
            self.peak_by_tag = {k: v for k, v in self.by_tag.items() if v}
        if self._phase is not None:
            p = self.phases[self._phase]
            if self.total_bytes > p.peak_bytes:
                p.peak_bytes = self.total_bytes
                p.by_tag = {k: v for k, v in self.by_tag.items() if v}

    # ------------------------------------------------------------------ the mode
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.track(out)
        else:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
        return out
