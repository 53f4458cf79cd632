"""A time limit per measurement of a GPU task, in the task's own process: a row that runs out of time, fails or
runs CUDA out of memory becomes that row's status, the task goes on with its next row, and every finished row is
saved at once (``ctx["on_row"]``), so a task killed later still leaves it in the report."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from typing import Callable


class Budget(Exception):
    """A run was stopped (or not started) because its time budget was spent."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise Budget inside the block after ``seconds`` (main thread, SIGALRM); a no-op for <= 0."""
    if seconds <= 0:
        raise Budget("no time left")

    def handler(signum, frame):
        raise Budget(f"stopped after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_guarded(label: str, fn: Callable[[], dict], ctx: dict) -> dict:
    """One measurement inside a section: its own time limit (what is left of the section's budget);
    a failure or an exhausted budget becomes the row's status. ``ctx["on_row"]`` (the child's) saves
    every finished row at once, so a child killed later still leaves it in the report."""
    t = time.perf_counter()
    try:
        with time_limit(ctx["remaining"]()):
            row = {"name": label, "status": "ok", **fn()}  # fn may name its own status
    except Budget as e:
        row = {"name": label, "status": f"skipped: budget ({e})"}
    except Exception as e:
        row = {"name": label, "status": f"failed: {type(e).__name__}: {e}"[:400]}
        if "out of memory" in str(e).lower():
            row["status"] = "failed: CUDA out of memory"
    with contextlib.suppress(Exception):
        from benchmarks.gpu.measure import fresh_memory

        fresh_memory(ctx["dev"])
    row["seconds"] = round(time.perf_counter() - t, 1)
    print(f"    {label}: {row['status']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    if ctx.get("on_row"):
        ctx["on_row"](row)
    return row
