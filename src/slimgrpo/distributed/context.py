"""Process-group context. A single process is world_size 1 and every collective is a no-op.

Collectives raise :class:`CollectiveError` with a message that says what went wrong in words (a peer
that died, a wait past ``distributed.timeout_s``) instead of the backend's raw text. ``agree`` turns an
exception on one rank into a prompt stop of every rank, each naming the rank that failed and why.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
from torch import nn

T = TypeVar("T")


class CollectiveError(RuntimeError):
    """A collective failed: another rank died, or the ranks waited longer than ``distributed.timeout_s``."""


class RankFailure(RuntimeError):
    """Another rank raised an exception; this rank stops too (the message names that rank and its error)."""


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout_s: float | None = None  # the process group's collective timeout (for error messages)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @staticmethod
    def _flag_device() -> str:
        """Where small control tensors must live for the backend: nccl only moves CUDA tensors."""
        return "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"

    def _run(self, what: str, fn: Callable[[], T]) -> T:
        """Run a collective, translating backend errors into a CollectiveError that says what happened."""
        try:
            return fn()
        except (RuntimeError, dist.DistError) as e:  # DistBackendError, gloo's "Connection closed by peer"
            raise CollectiveError(explain_collective_error(e, what, self.rank, self.timeout_s)) from e

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            t = t.clone()
            self._run("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM))
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            t = t.clone()
            self._run("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
        return t

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``t`` in place with rank ``src``'s values."""
        if self.enabled:
            self._run("broadcast", lambda: dist.broadcast(t, src=src))
        return t

    def all_gather_cat(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate equally-shaped tensors of all ranks along dim 0 (rank order)."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        self._run("all_gather", lambda: dist.all_gather(parts, t.contiguous()))
        return torch.cat(parts, dim=0)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (small control data only)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        self._run("all_gather_object", lambda: dist.all_gather_object(out, obj))
        return out

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` of all ranks (every rank gets it)."""
        if not self.enabled:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._flag_device())
        return int(self.all_reduce_max(t).item())

    def any_true(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        if not self.enabled:
            return bool(flag)
        t = torch.tensor([int(bool(flag))], dtype=torch.int32, device=self._flag_device())
        return bool(self.all_reduce_max(t).item())

    def barrier(self) -> None:
        if self.enabled:
            self._run("barrier", dist.barrier)

    @contextlib.contextmanager
    def agree(self, stage: str) -> Iterator[None]:
        """Run a block that may fail on some ranks only (user reward code, a bad batch, an OOM).

        On leaving the block every rank all-reduces one flag. When any rank raised, all of them stop
        together: the failing rank re-raises its own exception, the others raise :class:`RankFailure`
        naming it, instead of waiting in the next collective for a rank that will never come. The block
        itself must not run collectives (a failing rank would skip them)."""
        if not self.enabled:
            yield
            return
        try:
            yield
        except Exception as e:
            self._vote(stage, e)
            raise
        self._vote(stage, None)

    def _vote(self, stage: str, error: BaseException | None) -> None:
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=self._flag_device())
        flag = self.all_reduce_max(flag)
        if int(flag.item()) == 0:
            return
        message = None if error is None else f"{type(error).__name__}: {error}"
        messages: list[str | None] = [None] * self.world_size
        self._run("all_gather_object", lambda: dist.all_gather_object(messages, message))
        if error is not None:
            return  # the caller re-raises this rank's own exception
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        first_rank, first_message = failed[0]
        others = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
        raise RankFailure(f"rank {first_rank}{others} failed during {stage}: {first_message}")


def explain_collective_error(error: BaseException, what: str, rank: int, timeout_s: float | None) -> str:
    text = str(error)
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        limit = f"distributed.timeout_s={timeout_s:g}" if timeout_s else "the process-group timeout"
        return (f"rank {rank}: {what} waited longer than {limit} for the other ranks; one of them is stuck "
                f"or died (look for its error above; raise distributed.timeout_s if a step legitimately takes "
                f"that long). Backend said: {text.splitlines()[0] if text else type(error).__name__}")
    if any(s in low for s in ("connection closed", "connection reset", "broken pipe", "peer")):
        return (f"rank {rank}: {what} failed because another rank exited (its error is above in the output). "
                f"Backend said: {text.splitlines()[0]}")
    return f"rank {rank}: {what} failed: {text}"


class ModelForward(nn.Module):
    """The module DDP and FSDP2 wrap: its forward runs any function of the causal LM.

    DDP only synchronises gradients of a forward that went through its own ``__call__``, and FSDP2
    gathers the root group's weights (embeddings, final norm, LM head) in the root's forward hook. The
    trainer does not call ``model.forward`` (it runs the decoder and a chunked LM head itself), so it calls
    ``wrapped(fn, *args)``, which runs ``fn(causal_lm, *args)`` inside the wrapper's hooks."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def is_wrapped(model) -> bool:
    """A DDP / FSDP2 wrapper built by ``slimgrpo.distributed.wrap.wrap_model`` (call it as ``model(fn, ...)``)."""
    return isinstance(model, ModelForward) or isinstance(getattr(model, "module", None), ModelForward)


def from_environment() -> DistContext:
    """The context torchrun describes through RANK / WORLD_SIZE / LOCAL_RANK (world 1 otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    return DistContext(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
