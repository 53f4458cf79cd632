"""Numbers and names for people: counts with K/M/B, durations with units, memory sizes read and shown (``parse_bytes``,
``format_gib``), short distinct path labels."""

from __future__ import annotations

import os
import re
from pathlib import Path


def human_count(n: float) -> str:
    """1234 -> '1.2K', 494_032_768 -> '494M', 7.6e9 -> '7.6B' (parameters, tokens)."""
    n = float(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def human_duration(seconds: float) -> str:
    """42 -> '42 s', 754 -> '12 min 34 s', 7384 -> '2 h 3 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def path_label(path: str, width: int = 28) -> str:
    """One path as a short header: as given relative to the working folder when that is short, else its last
    components (``…/smollm2-addition/final``: the run, not ``tmp/…/final``)."""
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full)
    except ValueError:  # another drive (Windows)
        rel = full
    text = rel if not rel.startswith("..") else full
    if len(text) <= width:
        return text
    parts = Path(text).parts
    keep = parts[-1]
    for part in reversed(parts[:-1]):
        if len("…/" + part + "/" + keep) > width:
            break
        keep = part + "/" + keep
    if keep == parts[-1] and len(parts) > 1:  # the folder above is long: its end, then the name
        keep = parts[-2] + "/" + keep
    label = "…/" + keep
    return label if len(label) <= width else "…" + keep[-(width - 1):]


def column_labels(paths: list[str], width: int = 28) -> list[str]:
    """Short, distinct column headers: the path after the components all paths share, then (when long)
    its first and last components, ``alpha/…/checkpoint-40`` vs ``beta/…/checkpoint-40``. A single path:
    :func:`path_label`."""
    if len(paths) == 1:
        return [path_label(paths[0], width)]
    parts = [Path(os.path.abspath(p)).parts[1:] if os.path.exists(p) or len(paths) > 1 else Path(p).parts
             for p in paths]
    if len(paths) > 1:
        common = 0
        while all(len(q) > common + 1 for q in parts) and len({q[common] for q in parts}) == 1:
            common += 1
        parts = [q[common:] for q in parts]
    labels = []
    for q in parts:
        text = "/".join(q) or "."
        if len(text) > width and len(q) > 1:  # the part that differs (first) and the name (last)
            head, tail = q[0], q[-1]
            mid = "/…/" if len(q) > 2 else "/"
            room = max(width - len(tail) - len(mid), 4)
            text = (head if len(head) <= room else head[: room - 1] + "…") + mid + tail
        if len(text) > width:
            text = "…" + text[-(width - 1):]
        labels.append(text)
    if len(set(labels)) < len(labels):  # still alike after cutting: number them
        labels = [f"{i + 1}: {lb}" for i, lb in enumerate(labels)]
    return labels


_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_bytes(value: str | int) -> int:
    """Parse a memory size: an int (bytes) or a string such as "16GiB", "16 GB", "1.5TiB", "4096".

    Decimal units (kB, MB, GB, TB = 10^3k) and binary units (KiB, MiB, GiB, TiB = 2^10k) are kept
    apart; case does not matter. A bare "G"/"M"/"K" is ambiguous and rejected.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory size must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a memory size as int or string, got {type(value).__name__}")
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", value)
    if not match:
        raise ValueError(f"cannot read {value!r} as a memory size; write e.g. '16GiB', '24GB' or '8000MiB'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("k", "m", "g", "t"):
        raise ValueError(
            f"{value!r} is ambiguous: write {match.group(1)}{unit.upper()}iB (powers of 1024, what GPU tools "
            f"show) or {match.group(1)}{unit.upper()}B (powers of 1000)"
        )
    if unit == "":
        unit = "b"
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    return int(round(number * _UNITS[unit]))


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
def format_gib(n: int) -> str:
    """Bytes as GiB with two decimals ("0.00" for zero)."""
    return f"{n / 2**30:,.2f}"
