"""Memory caps for measured benchmark runs: a per-run cgroup (v2 or v1) where this machine allows
one, else an address-space rlimit or RSS polling by the intermediate process (``measure.py``); and the
cap's size as people write it (``parse_size``)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.tables import MIB


@dataclass
class MemoryCap:
    """How a run's memory is limited. ``mechanism``: cgroup-v2 | cgroup-v1 | rlimit-as | poll-rss | none."""

    bytes: int | None
    mechanism: str = "none"
    cgroup_parent: Path | None = None  # where per-run cgroups are created
    note: str = ""

    def describe(self) -> str:
        if self.bytes is None:
            return "none"
        return f"{self.bytes / 2**30:.1f} GiB via {self.mechanism}" + (f" ({self.note})" if self.note else "")


def parse_size(text: str) -> int:
    """``"8GiB"`` -> bytes. Accepts B, KiB, MiB, GiB, TiB, their decimal forms (KB, GB...) and plain numbers."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"not a memory size: {text!r} (examples: 8GiB, 512MiB, 8000000000)")
    number, unit = float(m.group(1)), m.group(2).upper()
    powers = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}
    prefix = unit[:1] if unit[:1] in "KMGT" and unit else ""
    base = 1024 if "I" in unit or unit in ("K", "M", "G", "T") else 1000
    return int(number * base ** powers[prefix])


def _own_cgroup_dirs() -> tuple[Path | None, Path | None]:
    """(v2 dir, v1 memory dir) of this process's cgroup, where they exist."""
    v2 = v1 = None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        hier, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hier == "0" and controllers == "":
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (mount / "cgroup.controllers").is_file():
                    v2 = mount / rel
                    break
        elif "memory" in controllers.split(","):
            v1 = Path("/sys/fs/cgroup/memory") / rel
    return v2, v1


def _try_cgroup(parent: Path, limit_file: str, cap: int) -> bool:
    probe = parent / f"slimgrpo-bench-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / limit_file).write_text(str(cap))
        return (probe / limit_file).read_text().strip() not in ("", "max")
    except OSError:
        return False
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def choose_memory_cap(cap_bytes: int | None, prefer: str = "auto") -> MemoryCap:
    """Pick the strongest mechanism available: a cgroup (counts real memory, the kernel kills on
    excess), else polling the child's RSS (kills it from outside), else RLIMIT_AS (address space:
    a conservative proxy that torch's large virtual reservations can trip early)."""
    if cap_bytes is None:
        return MemoryCap(None)
    v2, v1 = _own_cgroup_dirs()
    order = ["cgroup-v2", "cgroup-v1", "poll-rss", "rlimit-as"] if prefer == "auto" else [prefer]
    for mech in order:
        if mech == "cgroup-v2" and v2 is not None:
            # Under v2 the memory controller must be enabled for our children (it often is not).
            try:
                enabled = "memory" in (v2 / "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = False
            if enabled and _try_cgroup(v2, "memory.max", cap_bytes):
                return MemoryCap(cap_bytes, "cgroup-v2", v2, "memory.max on a per-run cgroup")
        elif mech == "cgroup-v1" and v1 is not None and _try_cgroup(v1, "memory.limit_in_bytes", cap_bytes):
            return MemoryCap(cap_bytes, "cgroup-v1", v1, "memory.limit_in_bytes on a per-run cgroup")
        elif mech == "poll-rss" and Path("/proc/self/status").is_file():
            return MemoryCap(cap_bytes, "poll-rss", None, "RSS of the child's process group polled every 0.1 s")
        elif mech == "rlimit-as":
            return MemoryCap(cap_bytes, "rlimit-as", None, "RLIMIT_AS address-space limit")
    raise RuntimeError(f"memory cap mechanism {prefer!r} is not available on this machine")


def make_run_cgroup(cap: MemoryCap, name: str) -> Path | None:
    """A fresh cgroup for one run (so its peak counter is that run's), or None for non-cgroup caps."""
    if cap.mechanism not in ("cgroup-v1", "cgroup-v2"):
        return None
    assert cap.cgroup_parent is not None and cap.bytes is not None
    path = cap.cgroup_parent / f"slimgrpo-bench-{os.getpid()}-{name}"
    if path.exists():
        path.rmdir()
    path.mkdir()
    if cap.mechanism == "cgroup-v1":
        (path / "memory.limit_in_bytes").write_text(str(cap.bytes))
        try:  # with swap, also cap memory+swap so the run cannot escape into swap
            (path / "memory.memsw.limit_in_bytes").write_text(str(cap.bytes))
        except OSError:
            pass
    else:
        (path / "memory.max").write_text(str(cap.bytes))
        try:
            (path / "memory.swap.max").write_text("0")
        except OSError:
            pass
    return path


def read_cgroup(path: Path) -> dict[str, Any]:
    """Peak usage (page cache included) and OOM-kill count of a per-run cgroup."""
    out: dict[str, Any] = {}

    def read(name: str) -> str | None:
        try:
            return (path / name).read_text()
        except OSError:
            return None

    peak = read("memory.max_usage_in_bytes") or read("memory.peak")
    if peak and peak.strip().isdigit():
        out["cgroup_peak_mib"] = int(peak) / MIB
    for name in ("memory.oom_control", "memory.events"):
        text = read(name)
        if text:
            m = re.search(r"^oom_kill (\d+)", text, flags=re.MULTILINE)
            if m:
                out["oom_kills"] = int(m.group(1))
    failcnt = read("memory.failcnt")
    if failcnt and failcnt.strip().isdigit():
        out["limit_hits"] = int(failcnt)
    return out


def remove_cgroup(path: Path | None) -> None:
    if path is None:
        return
    for _ in range(50):  # the kernel needs a moment after the last process exits
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)
