"""``log.report_to``: the metric sinks a run may name (the sinks themselves: ``output/backends.py``)."""

from __future__ import annotations

import difflib

BACKENDS = ("tensorboard", "wandb", "trackio", "mlflow")
CHOICES = (*BACKENDS, "none")


def parse_report_to(report_to: list[str] | str | None) -> list[str]:
    """Normalise ``log.report_to`` (a name, a comma-separated string or a list) to backend names.

    ``none`` (alone or mixed in) adds nothing; duplicates are dropped; unknown names raise ValueError
    with the nearest valid name. Imports nothing, so config validation can call it.
    """
    if report_to is None:
        return []
    items = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    names: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if not name or name == "none":
            continue
        if name not in BACKENDS:
            close = difflib.get_close_matches(name, CHOICES, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"log.report_to: unknown backend {item!r}.{hint} Choose from {', '.join(CHOICES)}.")
        if name not in names:
            names.append(name)
    return names
