"""Pinned host memory of exact sizes: what the plan counts is what the run holds.

torch's caching host allocator (``torch.empty(..., pin_memory=True)``) rounds every block up to a power of two
and keeps it for reuse: a 591 MB layer checkpoint of the 72K-token Qwen3-8B row held 1 GiB, ~36 GiB pinned
against the 20.8 GiB the plan counted. torch 2.13 can stop the rounding above a size
(``PYTORCH_ALLOC_CONF=pinned_max_round_threshold_mb:N``), but its cache then keeps an exact-size block for
every size it ever saw, and micro-batches trimmed to their longest row change size every step.

Here memory is pinned in place instead: a plain host tensor of the exact size, registered with the driver
(``cudaHostRegister``), as the full-fine-tuning reference's host copy is (``update/reference.py``).
:class:`PinnedPool` hands such buffers out for offloaded activations (``offload.py``) and takes them back
when backward has used them, so a step reuses the last step's buffers; a request no free buffer can hold
first releases free buffers too small to serve it, so what the pool holds stays the most that was live at
once. ``bytes_held`` is the bytes its buffers were made for (the number the plan's host line predicts; each
buffer is rounded up to whole pages, at most a page more; ``torch.cuda.host_memory_stats`` does not see these
bytes: they are not the caching allocator's).

Every pinned buffer starts on a page boundary and spans whole pages (``page_aligned_empty``): the driver
page-locks whole pages, so two buffers that shared one (small tensors from malloc lie next to each other)
would make the second registration fail (``cudaErrorHostMemoryAlreadyRegistered``). A registration that fails
anyway (locked-memory limits, a driver refusal) clears the error it left pending, so that no later, unrelated
CUDA call raises it, and the buffer is used unpinned: copies from it are synchronous, said once in the log.

The driver calls sit behind ``pin`` / ``unpin``: on a machine without CUDA (tests) they may be replaced by
functions that do nothing, and the pool's bookkeeping and the buffers' layout run unchanged.
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger("slimgrpo")

PAGE = mmap.PAGESIZE  # bytes: what the driver page-locks at a time (4 KiB on x86-64 and most aarch64 kernels)
_warned_unpinned: list[bool] = []  # a failed registration is said once per process


class PinFailed(RuntimeError):
    """``cudaHostRegister`` refused a buffer; the error it left pending was cleared."""


def page_aligned_empty(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 host tensor of ``nbytes`` rounded up to whole pages, starting on a page boundary:
    a view into a slightly larger allocation, which the view keeps alive. Pinning it locks its own pages only."""
    size = max(PAGE, -(-nbytes // PAGE) * PAGE)
    raw = torch.empty(size + PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE
    return raw[start:start + size]


def pin_or_warn(t: torch.Tensor, pin: Callable[[torch.Tensor], None] | None = None) -> bool:
    """Page-lock ``t`` (``pin``: default :func:`register_host`); where the driver refuses, say so once and return
    False: the caller uses ``t`` unpinned (its copies are synchronous)."""
    try:
        (pin or register_host)(t)
        return True
    except PinFailed as e:
        if not _warned_unpinned:
            _warned_unpinned.append(True)
            log.warning("%s: host buffers stay in pageable memory (copies to and from the GPU are synchronous)", e)
        return False


_registered = {"current": 0, "peak": 0}  # bytes pinned by register_host, now and at most (output/metrics.py)


def registered_bytes() -> tuple[int, int]:
    """(bytes pinned in place now, the most at once): not in ``torch.cuda.host_memory_stats()``."""
    return _registered["current"], _registered["peak"]


def register_host(t: torch.Tensor) -> None:
    """Page-lock ``t``'s memory in place (``cudaHostRegister``, portable): async copies from / to it overlap.
    ``t`` should be page-aligned and span whole pages (``page_aligned_empty``). Raises ``PinFailed``, with the
    driver's pending error cleared, where the driver refuses."""
    if t.numel() == 0:
        return
    nbytes = t.numel() * t.element_size()
    cudart = torch.cuda.cudart()
    err = int(cudart.cudaHostRegister(t.data_ptr(), nbytes, 1))
    if err != 0:
        cudart.cudaGetLastError()  # the failed call leaves its error pending: clear it, or the next kernel raises it
        raise PinFailed(f"cudaHostRegister of {nbytes:,} bytes at {t.data_ptr():#x} failed (cudaError {err})")
    _registered["current"] += nbytes
    _registered["peak"] = max(_registered["peak"], _registered["current"])


@dataclass
class HostBuffer:
    """One exact-size host buffer that many tensors are views of (``modeling.reference_copy``), and whether it
    has been page-locked in place yet (``pin_once``: a second stream over it must not register it again)."""

    tensor: torch.Tensor
    pinned: bool = False
    tried: bool = False

    def pin_once(self) -> None:
        """Page-lock the buffer the first time it is asked (where the driver refuses: unpinned, said once)."""
        if not self.tried:
            self.tried = True
            self.pinned = pin_or_warn(self.tensor)

    def unpin(self) -> None:
        """Undo the pin before the buffer's memory is freed (a reference dropped before the process ends)."""
        if self.pinned:
            unregister_host(self.tensor)
            self.pinned = False


def unregister_host(t: torch.Tensor) -> None:
    """Undo :func:`register_host` (before the tensor's memory is freed)."""
    if t.numel() == 0:
        return
    err = int(torch.cuda.cudart().cudaHostUnregister(t.data_ptr()))
    if err != 0:
        raise RuntimeError(f"cudaHostUnregister failed (cudaError {err})")
    _registered["current"] -= t.numel() * t.element_size()


@dataclass(eq=False)  # compared by identity (list.remove), not by the bytes in it
class _Buffer:
    data: torch.Tensor  # uint8, whole pages from a page boundary (page_aligned_empty)
    ready: Any = None  # a CUDA event: the last copy out of it is done (None: nothing pending)
    pinned: bool = True  # False: the driver refused it (pin_or_warn); unpinned when dropped only if pinned
    nbytes: int = 0  # the request it was made for (counted in bytes_held; ``data`` is that rounded to pages)


@dataclass(eq=False)
class Lease:
    """A buffer handed out; it goes back to the pool when the lease is released or garbage-collected (a saved
    tensor that backward never unpacked, e.g. after an error, still returns its buffer)."""

    pool: PinnedPool
    buffer: _Buffer
    released: bool = field(default=False)

    def used(self, ready: Any) -> None:
        """A copy out of the buffer was issued; ``ready``: the event after which it is done."""
        self.buffer.ready = ready

    def release(self) -> None:
        """Back to the pool (its memory is overwritten only after ``ready``)."""
        if not self.released:
            self.released = True
            self.pool._free.append(self.buffer)

    def __del__(self) -> None:
        self.release()


class PinnedPool:
    """Exact-size pinned host buffers, reused (module docstring).

    Args:
        pin / unpin: the driver calls (default :func:`register_host` / :func:`unregister_host`).
        cap_bytes: the most it may hold (the plan's host line); a request past it is served by an unpinned
            host tensor instead (synchronous copies, ``overflow_bytes`` counts them) and logged once."""

    def __init__(self, pin: Callable[[torch.Tensor], None] = register_host,
                 unpin: Callable[[torch.Tensor], None] = unregister_host, cap_bytes: int | None = None):
        self.pin, self.unpin, self.cap_bytes = pin, unpin, cap_bytes
        self._free: list[_Buffer] = []
        self.bytes_held = 0
        self.peak_bytes_held = 0
        self.overflow_bytes = 0
        self._warned = False

    def acquire(self, shape: torch.Size, dtype: torch.dtype) -> tuple[torch.Tensor, Lease | None]:
        """A host tensor of ``shape`` / ``dtype`` and its lease (None: an unpinned overflow tensor)."""
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        buf = self._take(nbytes)
        if buf is None:
            return self._overflow(shape, dtype, nbytes), None
        view = buf.data[:nbytes].view(dtype).view(shape)
        return view, Lease(self, buf)

    def _take(self, nbytes: int) -> _Buffer | None:
        fitting = [b for b in self._free if b.data.numel() >= nbytes]
        if fitting:
            best = min(fitting, key=lambda b: b.data.numel())
            self._free.remove(best)
            return best
        # Free buffers are all too small for this request: they go before a new one is made, so what the pool
        # holds stays what was live at once, however the sizes move from step to step.
        for b in list(self._free):
            self._drop(b)
        if self.cap_bytes is not None and self.bytes_held + nbytes > self.cap_bytes:
            return None
        data = page_aligned_empty(nbytes)
        pinned = pin_or_warn(data, self.pin)
        self.bytes_held += nbytes
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        return _Buffer(data, pinned=pinned, nbytes=nbytes)

    def _drop(self, b: _Buffer) -> None:
        self._free.remove(b)
        if b.ready is not None:
            b.ready.synchronize()  # no copy may still read it when the memory goes
        if b.pinned:
            self.unpin(b.data)
        self.bytes_held -= b.nbytes

    def _overflow(self, shape, dtype, nbytes: int) -> torch.Tensor:
        self.overflow_bytes += nbytes
        if not self._warned:
            self._warned = True
            log.warning("pinned activation pool: %s bytes held, a %s-byte tensor more would pass its cap of %s "
                        "(the plan's host line); it waits in unpinned memory instead (slower copies)",
                        f"{self.bytes_held:,}", f"{nbytes:,}", f"{self.cap_bytes:,}")
        return torch.empty(shape, dtype=dtype)

    def reset_peak(self) -> None:
        """Start a new peak (a benchmark's next row): ``peak_bytes_held`` becomes what the pool holds now."""
        self.peak_bytes_held = self.bytes_held

    def trim(self) -> None:
        """Release every free buffer (the memory goes back to the OS)."""
        for b in list(self._free):
            self._drop(b)


_POOLS: dict[str, PinnedPool] = {}


def activation_pool(device: torch.device) -> PinnedPool:
    """The process's pool for activations offloaded from ``device`` (one per device, kept across steps)."""
    key = str(device)
    if key not in _POOLS:
        _POOLS[key] = PinnedPool()
    return _POOLS[key]


def reset_pinned_peaks() -> None:
    """Start new peaks of what slimgrpo pinned (a benchmark's next row): the bytes pinned in place and every
    activation pool's, each becoming what is held now."""
    _registered["peak"] = _registered["current"]
    for pool in _POOLS.values():
        pool.reset_peak()


def set_activation_cap(device: torch.device, cap_bytes: int | None) -> None:
    """The most the pool for ``device`` may hold: the plan's host line for offloaded checkpoints."""
    activation_pool(device).cap_bytes = cap_bytes
