"""``slimgrpo report RUN_DIR [RUN_DIR ...]``: PNG plots of a run's metrics and one static HTML page, or
several runs overlaid on one page.

Everything is read back from the run folder the trainer wrote (metrics.jsonl, completions.jsonl,
config.yaml, summary.json), so a report can be built for a finished, crashed or running job, on
any machine, without torch. The page is self-contained: inline CSS, plots as relative <img> links
to the PNGs next to it, every piece of run text HTML-escaped (completions are model output).

    data.py      reading a run folder: metrics as series, status, first -> last changes
    plots.py     the PNG plots (matplotlib, imported only when drawing)
    page.py      one run's page and build_report
    compare.py   several runs on one page (build_comparison)
"""

from __future__ import annotations

from slimgrpo.report.compare import build_comparison, run_labels
from slimgrpo.report.data import (
    DELTA_KEYS, Metrics, Series, config_value, deltas, load_run, read_config, read_jsonl, run_status, value_ranges,
)
from slimgrpo.report.page import REPORT_DIR, build_report, page_html, render_page
from slimgrpo.report.plots import Plot, Run, make_plots


__all__ = [
    "DELTA_KEYS", "Metrics", "Plot", "REPORT_DIR", "Run", "Series", "build_comparison", "build_report",
    "config_value", "deltas", "load_run", "make_plots", "page_html", "read_config", "read_jsonl", "render_page",
    "run_labels", "run_status", "value_ranges",
]
