"""The GPU suite's child processes and what is read back from them: each task runs in its own process
group with a wall-clock limit (killed at it), its output in a log; a script's JSON and pytest's summary
become report rows. No torch, no project import (the driver, suite.py, uses these)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO_ROOT as REPO


_CURRENT: list[subprocess.Popen] = []


class Stop(Exception):
    """SIGTERM / SIGINT / SIGHUP reached the driver: report what was measured and stop."""


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def kill_group(proc: subprocess.Popen) -> None:
    """End a child and whatever it started in its process group: SIGTERM, then SIGKILL after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError, OSError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int | None, float]:
    """``cmd`` in its own process group, output to ``log``; (exit code or None when killed at ``timeout``,
    seconds). Never raises but Stop."""
    t = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        except OSError as e:
            f.write(f"could not start {cmd[:3]}: {e}\n".encode())
            return -1, time.monotonic() - t
        _CURRENT.append(proc)
        try:
            rc: int | None = proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = None
        except BaseException:
            kill_group(proc)
            raise
        finally:
            _CURRENT.remove(proc)
    return rc, time.monotonic() - t


def last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Traceback)", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rows_of(data: Any) -> list[dict]:
    """An outside script's JSON as report rows: its "rows", a list of objects, or one object."""
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return [r if isinstance(r, dict) else {"value": r} for r in data["rows"]]
    if isinstance(data, list):
        return [r if isinstance(r, dict) else {"value": r} for r in data]
    if isinstance(data, dict):
        return [data]
    return []


PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed|warnings?)")


def cuda_test_files() -> list[str]:
    """The test files that hold cuda-marked tests (pytest then collects only these)."""
    out = []
    for p in sorted((REPO / "tests").rglob("test_*.py")):  # tests/<room>/test_*.py
        try:
            if re.search(r"pytest\.mark\.cuda\b", p.read_text(errors="replace")):
                out.append(str(p.relative_to(REPO)))
        except OSError:
            continue
    return out


def pytest_summary(text: str, collect_only: bool) -> dict[str, Any]:
    counts = {k: 0 for k in ("passed", "failed", "skipped", "deselected", "error")}
    summary = [ln for ln in text.splitlines() if PYTEST_COUNT.search(ln) or " collected" in ln
               or re.search(r"\d+ tests? collected", ln)]
    last = summary[-1] if summary else ""
    for n, k in PYTEST_COUNT.findall(last):
        key = "error" if k.startswith("error") else k
        if key in counts:
            counts[key] += int(n)
    m = re.search(r"(\d+)(?:/\d+)? tests? collected", last) or re.search(r"collected (\d+) items?", text)
    if collect_only:
        counts["collected"] = int(m.group(1)) if m else 0
    problems = [ln for ln in text.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {**counts, "problems": problems[:30], "summary": last.strip("= ")}
