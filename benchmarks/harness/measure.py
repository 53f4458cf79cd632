"""A process's peak memory, measured from outside it.

``run_measured`` starts each run under a fresh *intermediate* process, this module run as a program:

    python -m benchmarks.harness.measure --out rusage.json [--rlimit-as BYTES] [--cgroup DIR]
        [--poll-cap BYTES] -- python -m benchmarks.children.NAME ...

The intermediate is started fresh for every run, so ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` read after the
child exits is the peak RSS of that one run (not the maximum over earlier runs); it applies the run's memory
cap (``memcap.py``) and stays outside the capped cgroup itself. ``peak_rss_of`` is the lighter way for a child
whose whole output is one report line: the parent reaps it with ``os.wait4`` and reads its own rusage.

Nothing here imports slimgrpo or TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.memcap import MemoryCap, make_run_cgroup, read_cgroup, remove_cgroup
from benchmarks.harness.paths import REPO_ROOT
from benchmarks.harness.records import RECORD_MARKER


@dataclass
class RunOutcome:
    returncode: int
    wall_s: float
    peak_rss_mib: float | None
    records: list[dict[str, Any]] = field(default_factory=list)
    cgroup: dict[str, Any] = field(default_factory=dict)
    killed_by_cap: bool = False
    log_path: str = ""
    error: str = ""


_OOM_PATTERNS = re.compile(
    r"out of memory|cannot allocate memory|MemoryError|can't allocate memory|std::bad_alloc|"
    r"DefaultCPUAllocator|killed by the benchmark's memory cap",
    re.IGNORECASE,
)


def run_measured(cmd: list[str], log_path: Path, cap: MemoryCap, run_name: str, env: dict[str, str] | None = None,
                 timeout_s: float | None = None, echo=None) -> RunOutcome:
    """Run ``cmd`` (in the repository root) under a fresh intermediate process that applies ``cap`` and reports
    the child's peak RSS. Child stdout lines starting with RECORD_MARKER are parsed as JSON records; every line
    goes to ``log_path``; ``echo(record)`` is called for each record as it arrives."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rusage_path = log_path.with_suffix(".rusage.json")
    rusage_path.unlink(missing_ok=True)
    cgroup = make_run_cgroup(cap, run_name)
    wrapper = [sys.executable, "-m", "benchmarks.harness.measure", "--out", str(rusage_path)]
    if cgroup is not None:
        wrapper += ["--cgroup", str(cgroup)]
    elif cap.mechanism == "rlimit-as":
        wrapper += ["--rlimit-as", str(cap.bytes)]
    elif cap.mechanism == "poll-rss":
        wrapper += ["--poll-cap", str(cap.bytes)]
    wrapper += ["--", *cmd]

    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    timed_out = threading.Event()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(wrapper, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, cwd=str(REPO_ROOT), start_new_session=True)
        assert proc.stdout is not None

        def kill_on_timeout() -> None:  # the whole session: intermediate, child and its children
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        watchdog = threading.Timer(timeout_s, kill_on_timeout) if timeout_s else None
        if watchdog:
            watchdog.daemon = True
            watchdog.start()
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if line.startswith(RECORD_MARKER):
                try:
                    rec = json.loads(line[len(RECORD_MARKER):])
                except json.JSONDecodeError:
                    continue
                records.append(rec)
                if echo:
                    echo(rec)
        rc = proc.wait()
        if watchdog:
            watchdog.cancel()
    wall = time.perf_counter() - t0

    usage: dict[str, Any] = {}
    if rusage_path.is_file():
        usage = json.loads(rusage_path.read_text())
        rc = usage.get("returncode", rc)
    cg = read_cgroup(cgroup) if cgroup is not None else {}
    remove_cgroup(cgroup)
    text = tail(log_path, 20000)
    killed = bool(usage.get("killed_by_poll")) or bool(cg.get("oom_kills")) or (
        rc != 0 and cap.bytes is not None and (rc in (-9, 137) or bool(_OOM_PATTERNS.search(text))))
    error = ""
    if timed_out.is_set():
        killed = False
        error = f"timed out after {timeout_s:.0f} s"
    elif rc != 0:
        error = "killed by the memory cap" if killed else _last_error_line(text) or f"exit code {rc}"
    return RunOutcome(rc, wall, usage.get("maxrss_kib", 0) / 1024 if usage else None, records, cg, killed,
                      str(log_path), error)


def peak_rss_of(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str], int]:
    """Run ``cmd`` (in the repository root) to its end: (exit code, its output lines, its peak RSS in bytes). The
    child is reaped with ``os.wait4``, not ``Popen.wait``, so the rusage is its own rather than a running maximum
    over earlier children; stderr joins stdout (one pipe, no deadlock)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=str(REPO_ROOT))
    lines = proc.stdout.read().strip().splitlines() or ["<no output>"]
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, lines, usage.ru_maxrss * 1024


def tail(path: Path, chars: int = 3000) -> str:
    """The last ``chars`` bytes of a log, as text ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_error_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith(RECORD_MARKER)]
    for line in reversed(lines):
        if re.match(r"^\w*(Error|Exception)\b|^\w+\.\w+Error|^[A-Za-z_.]+Error:", line.strip()):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


# ----------------------------------------------------------------------------- the intermediate process


def _tree_rss_bytes(root_pid: int) -> int:
    """RSS of a process and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parent[int(d.name)] = int(fields[1])
            rss[int(d.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(c for c, pp in parent.items() if pp == pid)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.harness.measure", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--cgroup")
    p.add_argument("--rlimit-as", type=int)
    p.add_argument("--poll-cap", type=int)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd

    def preexec() -> None:
        if a.cgroup:  # only the child (and what it starts) joins the capped cgroup, not this process
            procs = Path(a.cgroup) / "cgroup.procs"
            procs.write_text(str(os.getpid()))
        if a.rlimit_as:
            resource.setrlimit(resource.RLIMIT_AS, (a.rlimit_as, a.rlimit_as))

    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, preexec_fn=preexec)
    killed_by_poll = False
    if a.poll_cap:
        while child.poll() is None:
            if _tree_rss_bytes(child.pid) > a.poll_cap:
                print(f"killed by the benchmark's memory cap: RSS over {a.poll_cap / 2**30:.2f} GiB", flush=True)
                child.kill()
                killed_by_poll = True
                break
            time.sleep(0.1)
    try:
        rc = child.wait()
    except KeyboardInterrupt:
        child.kill()
        rc = child.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(a.out).write_text(json.dumps({
        "returncode": rc, "maxrss_kib": usage.ru_maxrss, "wall_s": time.perf_counter() - t0,
        "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "killed_by_poll": killed_by_poll,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
