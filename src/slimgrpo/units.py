"""Numbers for people: counts with K/M/B, durations with units."""

from __future__ import annotations


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
