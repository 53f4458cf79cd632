"""The device a step is planned for: what the step's memory-shaping choices follow.

A run decides some things by the device its tensors live on: on CPU the rollout decodes LoRA layers
through a merged copy of their weights and packs the LM head for oneDNN; on CUDA it does neither, and
offloaded checkpoints go to host memory on a side stream. A trace (``trace/step.py``) runs a CUDA
step's code on fake tensors that live on the CPU device, so a check of ``tensor.device.type`` there
would walk the CPU path and count memory a CUDA run never allocates (issue 29: a merged copy of every
LoRA layer made the traced generation phase 2.3x the plan's).

So every such choice asks :func:`device_kind` instead of reading ``.device.type`` itself::

    from slimgrpo.plan.target import device_kind, planned_device

    if device_kind(weight) == "cpu": ...          # the tensor's own device in a run
    with planned_device("cuda"):                  # the trace: every choice takes the CUDA path
        ...

What follows the planned device: choices that change which tensors a step allocates (the LoRA merge
and oneDNN packing in ``rollout/model_parts.py``, the offload path in ``update/offload.py``). Where the
planned device would put a tensor in host memory (an offloaded checkpoint), the code makes it inside
:func:`host_scope`, which the trace maps to its host account (``planned_device(kind, host=...)``).
What does not follow: calls that must run on the real device (``torch.cuda.synchronize``, CUDA streams
and graphs, a library's kernels); where the planned device would need one of those, the trace substitutes
a stand-in that keeps the real one's memory (``trace/standins.py``: the 4-bit base, 8-bit AdamW) or
says in its notes what it cannot follow. Choices that allocate the same on both devices (fused AdamW,
picked for CPU and CUDA alike in ``update/optim.py``) keep reading the real device.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Callable, ContextManager, Iterator

import torch

_PLANNED: ContextVar[str | None] = ContextVar("slimgrpo_planned_device", default=None)
_HOST: ContextVar[Callable[[], ContextManager[Any]] | None] = ContextVar("slimgrpo_host_scope", default=None)
KINDS = ("cpu", "cuda")


@contextlib.contextmanager
def planned_device(kind: str | None, host: Callable[[], ContextManager[Any]] | None = None) -> Iterator[None]:
    """Inside this block :func:`device_kind` answers ``kind`` ("cpu" or "cuda") whatever device a tensor is
    on; ``None`` leaves each tensor's own device in charge (a run). ``host``: a factory of the context
    :func:`host_scope` enters, where tensors a run would hold in host memory are made."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"planned device must be one of {KINDS} or None, got {kind!r}")
    token, host_token = _PLANNED.set(kind), _HOST.set(host)
    try:
        yield
    finally:
        _HOST.reset(host_token)
        _PLANNED.reset(token)


def host_scope() -> ContextManager[Any]:
    """The context to make a host-memory copy in (an offloaded checkpoint): the trace's host account while
    a trace gives one, else nothing."""
    factory = _HOST.get()
    return factory() if factory is not None else contextlib.nullcontext()


def planned() -> str | None:
    """The device type a trace is planning for, or None outside a trace."""
    return _PLANNED.get()


def device_kind(where: torch.Tensor | torch.device | str) -> str:
    """The device type a choice about ``where`` (a tensor, a device or its name) should follow: the
    planned one inside :func:`planned_device`, else ``where``'s own."""
    kind = _PLANNED.get()
    if kind is not None:
        return kind
    if isinstance(where, torch.Tensor):
        return where.device.type
    return torch.device(where).type


def traced_off_device(where: torch.Tensor | torch.device | str) -> bool:
    """True when the step is planned for a device ``where`` is not on (a trace of a CUDA step on CPU
    tensors): a CUDA-only call (streams, synchronize) must then be skipped or stood in for."""
    kind = _PLANNED.get()
    if kind is None:
        return False
    actual = where.device.type if isinstance(where, torch.Tensor) else torch.device(where).type
    return actual != kind
