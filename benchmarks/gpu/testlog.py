"""A pytest plugin for the GPU suite's ``cuda_tests``: one JSON line per event, appended to the file named by
``GPU_SUITE_TESTLOG`` as it happens, so a pytest killed at the suite's limit still leaves the result of every test
that finished and the name of the one it was in (``runner.tests_from_log`` reads it back).

    python -m pytest -p benchmarks.gpu.testlog ...       (with GPU_SUITE_TESTLOG=PATH; without it, a no-op)

Events: ``{"event": "collected", "tests": [nodeid, ...]}``, ``{"event": "start", "test": nodeid}``, and one
``{"event": "report", "test", "when", "outcome", "duration", "message"}`` per phase (setup, call, teardown).
No torch, no project import.
"""

from __future__ import annotations

import json
import os
import time

ENV = "GPU_SUITE_TESTLOG"


def _write(record: dict) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    record["t"] = round(time.time(), 3)
    with open(path, "a", encoding="utf-8") as f:  # opened per line: each line reaches the file before the next test
        f.write(json.dumps(record, default=str) + "\n")


def _message(report) -> str:
    """The one line that says why a phase failed or was skipped."""
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        return str(longrepr[2])[:300]
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and str(getattr(crash, "message", "") or "").strip():
        return str(crash.message).strip().splitlines()[0][:300]
    text = str(longrepr or "").strip().splitlines()
    return text[-1][:300] if text else ""


def pytest_collection_finish(session) -> None:
    _write({"event": "collected", "tests": [item.nodeid for item in session.items]})


def pytest_runtest_logstart(nodeid, location) -> None:
    _write({"event": "start", "test": nodeid})


def pytest_runtest_logreport(report) -> None:
    _write({"event": "report", "test": report.nodeid, "when": report.when, "outcome": report.outcome,
            "duration": round(report.duration, 3), "message": _message(report)})
