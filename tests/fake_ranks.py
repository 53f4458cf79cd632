"""Ranks as threads of one process: a ``Collectives`` per rank whose collectives meet the other ranks' at a
barrier, so a function that takes ``Collectives`` can be run "on two ranks" without torch.distributed and
compared with one process that holds every rank's rows."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch


class ThreadRanks:
    """``world_size`` ranks; ``run(fn)`` calls ``fn(rank_collectives)`` on each in its own thread."""

    def __init__(self, world_size: int = 2, timeout_s: float = 30.0):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[Any] = [None] * world_size

    def _exchange(self, rank: int, obj: Any) -> list[Any]:
        self._slots[rank] = obj
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # everyone has read before the next exchange overwrites the slots
        return out

    def run(self, fn: Callable[[Any], Any]) -> list[Any]:
        """Every rank's result, in rank order; an exception on any rank is raised here."""
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            try:
                results[rank] = fn(_Rank(self, rank))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                errors.append(e)
                self._barrier.abort()  # the other ranks stop waiting

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


class _Rank:
    """One rank's view (implements ``slimgrpo.collectives.Collectives``)."""

    enabled = True

    def __init__(self, ranks: ThreadRanks, rank: int):
        self._ranks, self.rank, self.world_size = ranks, rank, ranks.world_size
        self.calls = 0  # collectives this rank took part in

    def _exchange(self, obj: Any) -> list[Any]:
        self.calls += 1
        return self._ranks._exchange(self.rank, obj)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(t.detach().clone())
        out = parts[0].clone()
        for p in parts[1:]:
            out = out + p
        return out

    def max_over_ranks(self, value: int) -> int:
        return max(int(v) for v in self._exchange(int(value)))

    def any_true(self, flag: bool) -> bool:
        return any(self._exchange(bool(flag)))

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        t.copy_(self._exchange(t.detach().clone())[src])
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self._exchange(obj)

    def barrier(self) -> None:
        self._exchange(None)
