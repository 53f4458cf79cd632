"""The device a stage shapes its memory for, handed to it as a value (``DeviceTarget``).

Some choices follow the device: on CPU the rollout decodes LoRA layers through a merged copy of their weights
and packs the LM head for oneDNN, and attention takes K/V without repeating them; on CUDA it does neither, and
offloaded checkpoints go to pinned host memory on a side stream. A stage reads those choices from the target it
was built with, never from a global:

    DeviceTarget.of(weight)                      # a run: the tensors' own device
    DeviceTarget("cuda", host=account, simulated=True)   # a memory trace of a CUDA step on CPU fake tensors

The trace (``trace/step.py``) is the one caller of the second form: it builds the rollout engine and the update
with it, so that every choice a CUDA run makes is taken on its fake tensors, and the host copies a CUDA run would
make (offloaded checkpoints) are made inside ``host_scope()``, its host account. Calls that must run on the real
device (``torch.cuda.synchronize``, streams, graphs) ask ``off_device`` and are skipped or stood in for there.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch

KINDS = ("cpu", "cuda")


def _kind(where: torch.Tensor | torch.device | str) -> str:
    if isinstance(where, torch.Tensor):
        return where.device.type
    return torch.device(where).type


@dataclass(frozen=True)
class DeviceTarget:
    """``kind``: "cpu" or "cuda", the device whose memory choices a stage takes; ``host``: a factory of the
    context host-memory copies are made in (None: nothing to enter); ``simulated``: the tensors live elsewhere
    than ``kind`` (a trace), so each tensor's choices follow ``kind``, not its own device."""

    kind: str
    host: Callable[[], ContextManager[Any]] | None = None
    simulated: bool = False

    def __post_init__(self) -> None:
        if self.simulated and self.kind not in KINDS:
            raise ValueError(f"a simulated device target must be one of {KINDS}, got {self.kind!r}")

    @classmethod
    def of(cls, where: torch.Tensor | torch.device | str) -> DeviceTarget:
        """A run's target: the device type ``where`` (a tensor, a device or its name) is on."""
        return cls(_kind(where))

    def kind_of(self, where: torch.Tensor | torch.device | str) -> str:
        """The device type a choice about ``where`` follows: ``kind`` in a trace, else ``where``'s own."""
        return self.kind if self.simulated else _kind(where)

    def off_device(self, where: torch.Tensor | torch.device | str) -> bool:
        """A trace of a step planned for a device ``where`` is not on: a CUDA-only call must be skipped."""
        return self.simulated and _kind(where) != self.kind

    def host_scope(self) -> ContextManager[Any]:
        """The context a host-memory copy is made in: the trace's host account, else nothing."""
        return self.host() if self.host is not None else contextlib.nullcontext()


__all__ = ["DeviceTarget", "KINDS"]
