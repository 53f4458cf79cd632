"""The full-fine-tuning reference policy run on the accelerator with its weights streamed from host memory.

The frozen reference copy (``modeling.reference_copy``) lives in host memory: one exact-size byte buffer that
every weight is a view of. Run there, its log-probs were a CPU forward every step (minutes from ~1B
parameters). :class:`StreamedReference` runs it on the device instead, holding little there: the modules
outside the decoder layers (embedding, final norm, LM head, rotary tables) are copied in for the pass, and
each decoder layer's weights are copied in just before it runs and dropped after it, the next layer's copy
already in flight on a side stream while this one computes (at most two layers on the device at once). The
host buffer is pinned in place once (``pinned.register_host``: exact bytes, no power-of-two block), so the
copies are asynchronous.

``memory.reference_placement`` chooses: ``device`` (a copy kept on the device), ``stream`` (this module),
``host`` (the CPU forward, as before); ``auto`` is settled by the plan before weights load. On a CPU device
host memory is the device and nothing is streamed. The copies go through :class:`Transfers`, which on a
device other than CUDA (tests) copies synchronously, so the machinery runs unchanged on a CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from slimgrpo.memory.pinned import HostBuffer


class Transfers:
    """Host-to-device copies: on a side stream with events on CUDA, plain synchronous copies elsewhere."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._side = torch.cuda.Stream(device=device) if self.cuda else None

    def copy_in(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A device copy of ``host`` and the event that marks it done (None when already done)."""
        if not self.cuda:
            return host.to(self.device, copy=True), None
        with torch.cuda.stream(self._side):
            out = host.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._side)
        return out, done

    def wait(self, done: Any) -> None:
        """The compute stream waits for a copy before it reads the tensor."""
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)

    def release(self, t: torch.Tensor) -> None:
        """``t`` was made on the side stream and read on the compute stream: its memory is reused only after
        the compute stream's work so far is done."""
        if self.cuda:
            t.record_stream(torch.cuda.current_stream(self.device))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: the ``nn.ModuleList`` holding the most parameters (``model.model.layers`` in
    Hugging Face causal LMs)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        return []
    best = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(best)


@dataclass
class _Slot:
    """One tensor slot of a module: ``module._parameters[name]`` or ``module._buffers[name]``."""

    module: nn.Module
    table: str  # "_parameters" or "_buffers"
    name: str
    host: torch.Tensor


def _slots(modules: list[nn.Module], skip: set[int]) -> list[_Slot]:
    out = []
    for root in modules:
        for m in root.modules():
            if id(m) in skip:
                continue
            for table in ("_parameters", "_buffers"):
                for name, t in getattr(m, table).items():
                    if t is not None:
                        out.append(_Slot(m, table, name, t))
    return out


@dataclass
class _Unit:
    """Tensors moved together: one decoder layer, or everything outside them."""

    slots: list[_Slot]
    loaded: bool = False
    done: Any = None  # the event of its copies in flight
    device_tensors: list[torch.Tensor] = field(default_factory=list)


class StreamedReference:
    """Run ``model`` (weights in host memory) on ``device``, layer by layer (module docstring).

    Use as a context: inside it ``model`` computes on ``device``; on exit every weight is the host tensor again.
    ``loads`` records which unit was copied in, in order (``"rest"`` or a layer index), ``max_resident_layers``
    the most decoder layers on the device at once (tests)."""

    def __init__(self, model: nn.Module, device: torch.device, transfers: Transfers | None = None,
                 host: HostBuffer | None = None):
        self.model, self.device = model, device
        self.transfers = transfers or Transfers(device)
        layers = decoder_layers(model)
        self.layers = [_Unit(_slots([layer], set())) for layer in layers]
        inside = {id(m) for layer in layers for m in layer.modules()}
        self.rest = _Unit(_slots([model], inside))
        self._hooks: list[Any] = []
        self._layer_modules = layers
        self.loads: list[str | int] = []
        self.max_resident_layers = 0
        if self.transfers.cuda and host is not None:  # ``model``'s one host buffer (modeling.reference_copy)
            host.pin_once()  # page-locked in place once: the copies in are asynchronous from then on

    def _load(self, unit: _Unit, label: str | int) -> None:
        if unit.loaded:
            return
        self.loads.append(label)
        cache: dict[int, torch.Tensor] = {}  # a tied weight is copied once
        for slot in unit.slots:
            key = id(slot.host)
            if key not in cache:
                t, unit.done = self.transfers.copy_in(slot.host.detach())
                cache[key] = t
                unit.device_tensors.append(t)
            t = cache[key]
            getattr(slot.module, slot.table)[slot.name] = \
                nn.Parameter(t, requires_grad=False) if slot.table == "_parameters" else t
        unit.loaded = True
        self.max_resident_layers = max(self.max_resident_layers, sum(u.loaded for u in self.layers))

    def _drop(self, unit: _Unit) -> None:
        if not unit.loaded:
            return
        for slot in unit.slots:
            getattr(slot.module, slot.table)[slot.name] = slot.host
        for t in unit.device_tensors:
            self.transfers.release(t)
        unit.device_tensors.clear()
        unit.loaded, unit.done = False, None

    def _before(self, i: int):
        def hook(module, args):
            unit = self.layers[i]
            self._load(unit, i)  # loaded already when it was prefetched
            self.transfers.wait(unit.done)
            nxt = (i + 1) % len(self.layers)  # the last layer prefetches the first for the next micro-batch
            if nxt != i:
                self._load(self.layers[nxt], nxt)
        return hook

    def _after(self, i: int):
        def hook(module, args, output):
            self._drop(self.layers[i])
        return hook

    def __enter__(self) -> nn.Module:
        self._load(self.rest, "rest")
        self.transfers.wait(self.rest.done)
        for i, layer in enumerate(self._layer_modules):
            self._hooks.append(layer.register_forward_pre_hook(self._before(i)))
            self._hooks.append(layer.register_forward_hook(self._after(i)))
        return self.model

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for unit in [*self.layers, self.rest]:
            self._drop(unit)


@contextlib.contextmanager
def reference_on_device(policy, ref_model: nn.Module) -> Iterator[nn.Module]:
    """The module the reference log-probs run through: ``ref_model`` itself, or, for a streamed full-fine-tuning
    copy (``policy.reference_placement == "stream"``), the same module computing on the policy's device."""
    if policy.reference_placement != "stream" or ref_model is not policy.reference_cpu:
        yield ref_model
        return
    with StreamedReference(ref_model, policy.device, host=ref_model.host_buffer) as model:
        yield model
