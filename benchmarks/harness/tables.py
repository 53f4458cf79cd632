"""Numbers, tables and plots for people: MiB figures, markdown tables, matplotlib figures written to a file."""

from __future__ import annotations

from pathlib import Path

MIB = 1024 * 1024


def format_mib(value: float | None) -> str:
    """``1234.5`` -> ``"1,234"``; ``"-"`` for no value."""
    return "-" if value is None else f"{value:,.0f}"


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines: the header, ``|---|`` for every column, one line per row."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def save_plot(fig, png: Path) -> None:
    """Lay out and write a matplotlib figure (its folder made), and say where."""
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")
