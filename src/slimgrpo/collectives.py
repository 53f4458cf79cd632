"""The collectives a stage may need, as a type every floor can name: sums and maxima over the ranks, a
broadcast, a gather of small objects, a barrier, a vote. ``distributed.context.DistContext`` is the
torch.distributed implementation; ``SINGLE`` is one process, where every collective returns its input.

A stage that must agree with the other ranks receives a ``Collectives`` through its constructor (or as an
argument of a pure function); nothing is patched onto an object after it is built, and no data container
carries one.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Collectives(Protocol):
    """What a stage may ask of the ranks (``DistContext`` has these and more)."""

    rank: int
    world_size: int

    @property
    def enabled(self) -> bool:
        """More than one rank: the collectives do something."""
        ...

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` over the ranks (a new tensor; ``t`` itself where there is one rank)."""
        ...

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` of all ranks."""
        ...

    def any_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        ...

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``t`` in place with rank ``src``'s values."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (small control data: names whose set differs by rank)."""
        ...

    def barrier(self) -> None:
        """Wait until every rank is here."""
        ...


class SingleProcess:
    """One process: every collective returns its input."""

    rank = 0
    world_size = 1
    enabled = False

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def max_over_ranks(self, value: int) -> int:
        return int(value)

    def any_true(self, flag: bool) -> bool:
        return bool(flag)

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None


SINGLE = SingleProcess()
