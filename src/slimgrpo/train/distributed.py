"""Process-group context. A single process is world_size 1 and every collective is a no-op."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def all_gather_cat(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate equally-shaped tensors of all ranks along dim 0 (rank order)."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def from_environment() -> DistContext:
    """The context torchrun describes through RANK / WORLD_SIZE / LOCAL_RANK (world 1 otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    return DistContext(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
