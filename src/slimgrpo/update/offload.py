"""Activation offload: tensors saved for backward go to host memory during the forward pass and come
back when backward needs them.

``torch.autograd.graph.save_on_cpu`` (what ``memory.offload_activations`` used first) copies every
saved tensor synchronously, weights included: the forward pass waits for each device-to-host copy,
and each micro-batch moves a copy of the weights (saved by every linear layer) over PCIe twice.

:class:`AsyncOffload` does three things differently on CUDA:

* parameters (and anything below ``min_bytes``) stay where they are: they live on the device anyway,
  so offloading them frees nothing;
* the device-to-host copy runs on a side stream into pinned host memory, so the forward pass goes on
  computing while the copy is in flight; the device memory is handed back to the caching allocator
  only once that copy is done (``record_stream``);
* the host-to-device copy back is issued on the compute stream, asynchronously from pinned memory;
* the pinned memory comes from an exact-size pool kept across micro-batches and steps (``pinned.py``), not
  from torch's caching host allocator, which rounds each block up to a power of two (~36 GiB pinned for
  20.8 GiB of planned checkpoints); a buffer goes back to the pool when autograd drops the saved tensor, and
  is written again only after its copy back to the device is done.

Values make the round trip unchanged, so gradients are identical (the test checks it). On a CPU
device there is nothing to gain; :func:`offload_context` then uses ``save_on_cpu``. A trace of a CUDA step (a
simulated ``DeviceTarget``, ``slimgrpo/target.py``) takes the CUDA path on CPU fake tensors: each offloaded
tensor becomes a copy made in the target's ``host_scope`` (counted as host memory) and comes back as a fresh
device copy in backward.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch import nn

from slimgrpo.memory.pinned import PinnedPool, activation_pool
from slimgrpo.target import DeviceTarget

# Saved tensors under this many bytes stay on the device: not worth a copy (update/costs.py counts the same).
OFFLOAD_MIN_BYTES = 1 << 20
DEFAULT_MIN_BYTES = OFFLOAD_MIN_BYTES


class AsyncOffload(torch.autograd.graph.saved_tensors_hooks):
    """``saved_tensors_hooks`` that park saved activations in (pinned) host memory.

    Args:
        min_bytes: tensors smaller than this stay on the device.
        device_types: devices whose tensors are offloaded (default: ``("cuda",)``; tests pass
            ``("cpu",)`` to run the same packing logic on a CPU, where it is a plain copy).
        pool: where host copies go: on CUDA the device's pool (``pinned.activation_pool``) unless given; off
            CUDA a pool only when given (tests: a ``PinnedPool`` whose pin / unpin do nothing), else a plain
            copy made in ``target.host_scope()`` (the trace's host account).
        target: the device whose path is taken (None: each tensor's own; a trace passes a simulated CUDA one).

    Attributes ``offloaded`` / ``offloaded_bytes`` count what was moved (for tests and metrics)."""

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES, device_types: tuple[str, ...] = ("cuda",),
                 pool: PinnedPool | None = None, target: DeviceTarget | None = None):
        self.min_bytes = min_bytes
        self.target = target
        self.device_types = device_types
        self.pool = pool
        self._seen: dict[int, tuple[weakref.ref, int, tuple]] = {}  # id(tensor) -> (tensor, version, packed)
        self.offloaded = 0
        self.offloaded_bytes = 0
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> AsyncOffload:
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self._seen.clear()  # only autograd holds the packed tensors now: each buffer returns once it is used

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _keep(self, t: torch.Tensor) -> bool:
        kind = self.target.kind_of(t) if self.target is not None else t.device.type
        if kind not in self.device_types or t.layout != torch.strided:
            return True
        if t.numel() * t.element_size() < self.min_bytes:
            return True
        base = t._base if t._base is not None else t  # linear layers save a transposed view of the weight
        return isinstance(base, nn.Parameter) or (base.requires_grad and base.is_leaf)

    def _pack(self, t: torch.Tensor):
        if self._keep(t):
            return ("kept", t)
        # A tensor saved twice (RMSNorm's fp32 input: by pow and by mul) is copied once. The weak reference
        # makes sure it is the same live tensor, not a new one at a reused id, and the version that it was not
        # changed in place since.
        seen = self._seen.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return seen[2]
        packed = self._pack_new(t)
        self._seen[id(t)] = (weakref.ref(t), t._version, packed)
        return packed

    def _pack_new(self, t: torch.Tensor):
        self.offloaded += 1
        self.offloaded_bytes += t.numel() * t.element_size()
        if t.device.type != "cuda":  # a CPU device (tests), or a CUDA step traced on CPU fake tensors
            if self.pool is not None:  # the pool's bookkeeping on a CPU (tests)
                host, lease = self.pool.acquire(t.shape, t.dtype)
                host.copy_(t.detach())
                return ("host", t.device, host, None, lease)
            scope = self.target.host_scope() if self.target is not None else contextlib.nullcontext()
            with scope:  # a trace counts the copy in its host account
                return ("host", t.device, t.detach().to("cpu", copy=True), None, None)
        host, lease = (self.pool or activation_pool(t.device)).acquire(t.shape, t.dtype)
        side = self._side_stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))  # t is complete before it is copied
        if lease is not None and lease.buffer.ready is not None:
            side.wait_event(lease.buffer.ready)  # the buffer's last copy back to the device is done
        with torch.cuda.stream(side):
            host.copy_(t.detach(), non_blocking=lease is not None)
            done = torch.cuda.Event()
            done.record(side)
        t.record_stream(side)  # the allocator reuses t's memory only after the copy
        return ("host", t.device, host, done, lease)

    def _unpack(self, packed):
        if packed[0] == "kept":
            return packed[1]
        _, device, host, done, lease = packed
        if done is None:  # traced: a device copy, as the CUDA run makes (.to would alias the CPU tensor)
            off = self.target is not None and self.target.off_device(host)
            return host.clone() if off or lease is not None else host.to(device)
        stream = torch.cuda.current_stream(device)
        stream.wait_event(done)
        out = host.to(device, non_blocking=True)
        if lease is not None:  # the buffer returns to the pool when autograd drops ``packed``, after this copy
            back = torch.cuda.Event()
            back.record(stream)
            lease.used(back)
        return out


def offload_context(enabled: bool, device: torch.device, target: DeviceTarget | None = None,
                    min_bytes: int = DEFAULT_MIN_BYTES):
    """The context ``accumulate_gradients`` runs each forward pass in: nothing when disabled,
    :class:`AsyncOffload` on CUDA, ``save_on_cpu`` elsewhere. The choice follows ``target`` (None: ``device``'s
    own): a trace of a CUDA step takes the CUDA path."""
    if not enabled:
        return contextlib.nullcontext()
    if (target or DeviceTarget.of(device)).kind_of(device) == "cuda":
        return AsyncOffload(min_bytes=min_bytes, target=target)
    return torch.autograd.graph.save_on_cpu(pin_memory=False)

