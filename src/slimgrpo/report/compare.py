"""``slimgrpo report RUN_A RUN_B ...``: several runs overlaid on one page (one colour per run), their status
and first -> last changes side by side, and the config keys in which they differ."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from slimgrpo.report.data import config_value, deltas, load_run, run_status, value_ranges
from slimgrpo.report.page import _esc, _flatten, _fresh_dir, _shown, figures_html, page_html, pair_text
from slimgrpo.report.plots import Run, make_plots
from slimgrpo.units import column_labels


def run_labels(run_dirs: list[str]) -> list[str]:
    """Distinct short names: the folder names, or the path below what the folders share."""
    names = [Path(os.path.abspath(d)).name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    return column_labels([os.path.abspath(d) for d in run_dirs])


def _runs_table(labels: list[str], loaded: list[tuple[Any, dict, dict | None]]) -> str:
    metrics = []
    for _, (m, _s, _c) in zip(labels, loaded):
        for label, _a, _b in deltas(m):
            if label not in metrics:
                metrics.append(label)
    head = "".join(f"<th>{_esc(lb)}</th>" for lb in labels)
    rows = ["<tr><td>status</td>" + "".join(f"<td>{_esc(run_status(m, s, c)[1])}</td>" for m, s, c in loaded) + "</tr>"]
    for metric in metrics:
        cells = []
        for m, _s, _c in loaded:
            found = next(((a, b) for lb, a, b in deltas(m) if lb == metric), None)
            if found is None:
                cells.append("<td>—</td>")
                continue
            text = " → ".join(pair_text(metric, *found))
            cells.append(f"<td class='num'>{_esc(text)}</td>")
        rows.append(f"<tr><td>{_esc(metric)}</td>{''.join(cells)}</tr>")
    return (f'<div class="scroll"><table class="deltas"><thead><tr><th>first → last</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _config_diff(labels: list[str], configs: list[dict | None]) -> str:
    flat = [dict(_flatten(c)) if c else {} for c in configs]
    keys = sorted({k for f in flat for k in f})
    differ = [k for k in keys if len({_shown(f.get(k)) for f in flat}) > 1 and k != "run.output_dir"]
    if not differ:
        return '<p class="note">The runs\' configs are identical (apart from run.output_dir).</p>'
    head = "".join(f"<th>{_esc(lb)}</th>" for lb in labels)
    rows = "".join(f"<tr><td><code>{_esc(k)}</code></td>" + "".join(
        f"<td><code>{_esc(_shown(f.get(k)) if k in f else '—')}</code></td>" for f in flat) + "</tr>" for k in differ)
    return (f'<div class="scroll"><table class="config"><thead><tr><th>key</th>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def build_comparison(run_dirs: list[str], out: str | None = None, x: str = "step") -> Path:
    """Overlay the runs' metrics; write ``OUT/index.html`` (default ``report-compare`` in the working folder)."""
    loaded = [load_run(d, x) for d in run_dirs]
    labels = run_labels(run_dirs)
    out_dir = Path(out or "report-compare")
    _fresh_dir(out_dir)
    runs = [Run(lb, m, value_ranges(Path(d))) for lb, d, (m, _s, _c) in zip(labels, run_dirs, loaded)]
    plots = make_plots(runs, out_dir, beta_zero=all(config_value(c, "loss.beta") == 0 for _m, _s, c in loaded))
    links = "".join(
        f"<li><b>{_esc(lb)}</b>: {_esc(os.path.abspath(d))}"
        + (f' (<a href="{_esc(Path(os.path.relpath(Path(d) / "report" / "index.html", out_dir)).as_posix())}">'
           "its report</a>)" if (Path(d) / "report" / "index.html").is_file() else "") + "</li>"
        for lb, d in zip(labels, run_dirs))
    body = (f'<h2 id="runs">Runs</h2><ul>{links}</ul>{_runs_table(labels, loaded)}'
            f'<h2 id="plots">Plots</h2><p class="note">One colour per run; bold = smoothed (EMA), faint = every '
            f'step.</p><div class="plots">{figures_html(plots)}</div>'
            f'<h2 id="config">Config differences</h2>{_config_diff(labels, [c for _m, _s, c in loaded])}')
    steps = [m.last_step for m, _s, _c in loaded]
    page = out_dir / "index.html"
    page.write_text(page_html(f"slimgrpo comparison: {' vs '.join(labels)}",
                              f"{len(run_dirs)} runs · up to step {max(steps) if steps else 0}"
                              + ("" if x == "step" else " · x axis: training time"),
                              [("runs", "Runs"), ("plots", "Plots"), ("config", "Config differences")], body),
                    encoding="utf-8")
    return page


__all__ = ["build_comparison", "run_labels"]
