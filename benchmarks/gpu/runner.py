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
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO_ROOT as REPO


_CURRENT: list[subprocess.Popen] = []


class Stop(BaseException):
    """SIGTERM / SIGINT / SIGHUP reached the driver: report what was measured and stop. A BaseException, so that
    no ``except Exception`` guard on the way (a pip call, a report write) swallows it and the suite runs on."""


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


# ----------------------------------------------------------------------------- cuda_tests: one result per test

OUTCOMES = ("passed", "failed", "error", "skipped")
_VERBOSE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def tests_from_log(path: Path) -> dict[str, Any]:
    """The testlog plugin's lines (benchmarks/gpu/testlog.py) as {"collected": [nodeid], "tests": [{test, outcome,
    s, message}], "running": nodeid or None}: a test whose phases all ended is passed / failed (its call failed) /
    error (its setup or teardown failed) / skipped; one that started and did not end is the one pytest was in when
    it was stopped. A line cut short by the kill is left out."""
    collected: list[str] = []
    phases: dict[str, list[dict]] = {}
    started: list[str] = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        ev = rec.get("event")
        if ev == "collected":
            collected = list(rec.get("tests") or [])
        elif ev == "start":
            started.append(rec.get("test", "?"))
            phases.setdefault(rec.get("test", "?"), [])
        elif ev == "report":
            phases.setdefault(rec.get("test", "?"), []).append(rec)
    tests, running = [], None
    for nodeid in started or list(phases):
        reps = phases.get(nodeid, [])
        by = {r.get("when"): r for r in reps}
        seconds = round(sum(float(r.get("duration") or 0) for r in reps), 2)
        bad = [r for r in reps if r.get("outcome") == "failed"]
        if bad:
            outcome = "failed" if bad[0].get("when") == "call" else "error"
            message = bad[0].get("message", "")
        elif "teardown" not in by:
            running = nodeid
            outcome, message = "running when stopped", ""
        elif any(r.get("outcome") == "skipped" for r in reps):
            outcome = "skipped"
            message = next(r.get("message", "") for r in reps if r.get("outcome") == "skipped")
        else:
            outcome, message = "passed", ""
        tests.append({"test": nodeid, "outcome": outcome, "s": seconds, "message": message})
    return {"collected": collected, "tests": tests, "running": running}


def tests_from_junit(path: Path) -> dict[str, Any]:
    """pytest's --junitxml (written when pytest ends, so absent after a kill) in the shape of tests_from_log."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"collected": [], "tests": [], "running": None}
    tests = []
    for case in root.iter("testcase"):
        name, cls, file = case.get("name", "?"), case.get("classname", ""), case.get("file")
        if file:  # xunit1 (the suite asks for it): classname = the module, dotted, then any class
            module = file.removesuffix(".py").replace("/", ".")
            inner = cls[len(module) + 1:] if cls.startswith(module + ".") else ""
            nodeid = "::".join([file, *filter(None, inner.split(".")), name])
        else:
            nodeid = f"{cls}::{name}"
        outcome, message = "passed", ""
        for tag, what in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                text = (el.get("message") or "").strip()
                outcome, message = what, text.splitlines()[0][:300] if text else ""
                break
        tests.append({"test": nodeid, "outcome": outcome, "s": round(float(case.get("time") or 0), 2),
                      "message": message})
    return {"collected": [t["test"] for t in tests], "tests": tests, "running": None}


def tests_from_output(text: str) -> dict[str, Any]:
    """The last resort: pytest -v's "nodeid PASSED" lines."""
    tests = []
    for line in text.splitlines():
        m = _VERBOSE.match(line.strip())
        if m:
            word = m.group(2).lower()
            outcome = {"xfail": "skipped", "xpass": "passed"}.get(word, word)
            tests.append({"test": m.group(1), "outcome": outcome, "s": None, "message": ""})
    return {"collected": [], "tests": tests, "running": None}


def test_results(testlog: Path, junit: Path, text: str) -> dict[str, Any]:
    """Per-test results of the cuda_tests child, whether it ended or was killed: the testlog plugin's lines
    (written as each test ends), else the JUnit XML (written at the end), else pytest -v's output. Counts per
    outcome, the tests collected, the one running when it was stopped, and which source answered."""
    for source, res in (("testlog", tests_from_log(testlog)), ("junit", tests_from_junit(junit)),
                        ("pytest -v output", tests_from_output(text))):
        if res["tests"] or res["collected"]:
            break
    else:
        source, res = "none", {"collected": [], "tests": [], "running": None}
    counts = {k: sum(t["outcome"] == k for t in res["tests"]) for k in OUTCOMES}
    collected = len(res["collected"]) or len(res["tests"])
    return {**counts, "collected": collected, "finished": sum(counts.values()), "running": res["running"],
            "not_started": max(collected - len(res["tests"]), 0), "tests": res["tests"], "source": source}


def pytest_row(text: str, collect_only: bool, rc: int | None, testlog: Path, junit: Path) -> dict[str, Any]:
    """The cuda_tests report row: pytest's closing line where it printed one, the counts and one entry per test
    from test_results (so they hold after a kill, when pytest printed no closing line)."""
    row = pytest_summary(text, collect_only)
    res = test_results(testlog, junit, text)
    if res["source"] != "none":
        row.update({k: res[k] for k in OUTCOMES}, collected=res["collected"] or row.get("collected", 0))
    row.update(returncode=rc, finished=res["finished"], running=res["running"],
               not_started=None if collect_only else res["not_started"],
               tests=res["tests"], source=res["source"], junit=junit.name if junit.is_file() else None)
    return row


def pytest_status(row: dict[str, Any], rc: int | None, seconds: float, collect_only: bool, text: str) -> str:
    bad = [t["test"].rsplit("::", 1)[-1] for t in row.get("tests", []) if t["outcome"] in ("failed", "error")]
    failed = f"; failed: {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}" if bad else ""
    if rc is None:
        where = f"; stopped in {row['running']}" if row.get("running") else ""
        return (f"stopped: budget ({seconds:.0f} s) after {row.get('finished', 0)} of {row.get('collected') or '?'} "
                f"tests{failed}{where}")[:400]
    if rc in (0, 5) and (not collect_only or row.get("collected")):
        return "ok"
    return f"failed: pytest exit {rc}{failed or ': ' + (row.get('summary') or last_error(text))}"[:400]
