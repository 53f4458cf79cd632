"""The machine a figure was measured on: its description for a results header (CPU, cores, RAM, GPU, library
versions), the machine and load lines the benchmarks print, and competing load on demand (busy-loop processes).

Times are only meaningful on a quiet machine; every table says what the machine and its load were."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, GPU and library versions, for the header of a results table."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "tokenizers", "slimgrpo"):
        info[name] = version(name)
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    except ImportError:
        pass
    return info


def machine_line(info: dict[str, Any]) -> str:
    """``Machine: CPU, N cores, R GiB RAM`` of ``machine_info()``."""
    return f"Machine: {info['cpu']}, {info['cpu_cores']} cores, {info['ram_gib']} GiB RAM"


def load_line(when: str) -> str:
    """``load 1.02 0.88 0.61 at WHEN``: the 1, 5 and 15 minute load averages now."""
    load = os.getloadavg()
    return f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at {when}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version(name: str) -> str | None:
    """The installed version of distribution ``name``; None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(name)
    except PackageNotFoundError:
        return None


def start_competitors(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (a Python busy loop each): a reproducible "busy machine"."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(n)]


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()
