"""A rich progress bar with ETA; compact metric lines print above it. Falls back to plain lines when
the output is not a terminal (CI logs stay readable)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "GRPO",
                 bar: bool = True):
        """``enabled=False`` prints nothing (e.g. ranks other than 0); ``bar=False`` (``log.progress=false``)
        drops the bar but keeps the metric lines."""
        self.total, self.done, self.enabled = total, start, enabled
        self.console = Console(stderr=False)
        self.interactive = enabled and bar and self.console.is_terminal
        self.t0 = time.perf_counter()
        self.start = start
        self._bar = None
        self.description = description

    def __enter__(self) -> "Progress":
        if self.interactive:
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, completed=self.done)
        return self

    def advance(self, line: str | None = None) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            if line:
                self._bar.console.print(line, highlight=False)
            self._bar.update(self._task, completed=self.done)
        elif line:
            elapsed = time.perf_counter() - self.t0
            rate = (self.done - self.start) / max(elapsed, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            print(f"[{self.done}/{self.total} eta {eta:.0f}s] {line}", file=sys.stdout, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
