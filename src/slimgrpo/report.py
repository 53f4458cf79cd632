"""``slimgrpo report RUN_DIR``: PNG plots of a run's metrics and one static HTML page.

Everything is read back from the run folder the trainer wrote (metrics.jsonl, completions.jsonl,
config.yaml, summary.json), so a report can be built for a finished, crashed or running job, on
any machine, without torch. The page is self-contained: inline CSS, plots as relative <img> links
to the PNGs next to it, every piece of run text HTML-escaped (completions are model output).
"""

from __future__ import annotations

import html
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("slimgrpo")

REPORT_DIR = "report"
MAX_SAMPLES = 48  # completions shown on the page (the first logged step, then the newest)
MAX_TEXT_CHARS = 4000  # longer prompts/completions are cut on the page (the JSONL keeps them whole)


# ----------------------------------------------------------------------------- reading the run


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a half-written last line (a run killed mid-write) is skipped."""
    records = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                log.warning("%s: skipping a truncated last line", path)
                continue
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
        if isinstance(record, dict):
            records.append(record)
    return records


def _number(value: Any) -> float:
    """A plottable float; null, strings and non-finite values become NaN (a gap in the line)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return math.nan


@dataclass
class Series:
    """One metric over the run: x = steps, y = values with NaN where the metric was null/absent."""

    key: str
    steps: list[float]
    values: list[float]

    @property
    def present(self) -> bool:
        return any(not math.isnan(v) for v in self.values)


class Metrics:
    def __init__(self, records: list[dict[str, Any]]):
        self.records = records
        self.steps = [_number(r.get("step", i + 1)) for i, r in enumerate(records)]
        self.keys = sorted({k for r in records for k in r})

    def series(self, key: str) -> Series:
        return Series(key, self.steps, [_number(r.get(key)) for r in self.records])

    def has(self, *keys: str) -> bool:
        return any(self.series(k).present for k in keys)

    def reward_functions(self) -> list[str]:
        """Names of the reward functions, from the ``rewards/<fn>/mean`` keys, in first-seen order."""
        names: list[str] = []
        for r in self.records:
            for k in r:
                if k.startswith("rewards/") and k.endswith("/mean") and k[8:-5] not in names:
                    names.append(k[8:-5])
        return names


# ----------------------------------------------------------------------------- plots


@dataclass
class Plot:
    filename: str
    title: str
    caption: str


def _new_figure(nrows: int = 1):
    # Figure + Agg canvas directly: no pyplot, so no global backend state and no GUI window.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.4 if nrows == 1 else 1.9 + 1.5 * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, 1, 1)]
    axes += [fig.add_subplot(nrows, 1, i + 1, sharex=axes[0]) for i in range(1, nrows)]
    return fig, axes


def _line(ax, s: Series, label: str | None = None, marker_limit: int = 60, **kw):
    # Markers when points are few: a single step, or a point isolated between nulls, stays visible.
    sparse = sum(not math.isnan(v) for v in s.values) <= marker_limit
    return ax.plot(s.steps, s.values, label=label or s.key, marker="o" if sparse else None,
                   markersize=3.5, linewidth=1.6, **kw)[0]


def _band(ax, mean: Series, spread: Series, color) -> None:
    lo = [m - s for m, s in zip(mean.values, spread.values)]
    hi = [m + s for m, s in zip(mean.values, spread.values)]
    ax.fill_between(mean.steps, lo, hi, color=color, alpha=0.18, linewidth=0)


def _finish(fig, axes, path: Path, ylabels: list[str]) -> None:
    for ax, ylabel in zip(axes, ylabels):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize="small")
    from matplotlib.ticker import MaxNLocator

    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    fig.savefig(path)


def _plot_lines(m: Metrics, out: Path, filename: str, title: str, caption: str,
                panels: list[tuple[str, list[tuple[str, str]]]]) -> Plot | None:
    """A figure with one panel per (ylabel, [(key, label), ...]); panels without data are dropped."""
    panels = [(yl, [(k, lb) for k, lb in keys if m.series(k).present]) for yl, keys in panels]
    panels = [(yl, keys) for yl, keys in panels if keys]
    if not panels:
        return None
    fig, axes = _new_figure(len(panels))
    for ax, (_, keys) in zip(axes, panels):
        for key, label in keys:
            _line(ax, m.series(key), label)
    axes[0].set_title(title)
    _finish(fig, axes, out / filename, [yl for yl, _ in panels])
    return Plot(filename, title, caption)


def _plot_reward(m: Metrics, out: Path) -> Plot | None:
    if not m.has("reward"):
        return None
    fig, (ax,) = _new_figure()
    mean = m.series("reward")
    line = _line(ax, mean, "reward (mean)")
    if m.has("reward_std"):
        _band(ax, mean, m.series("reward_std"), line.get_color())
    ax.set_title("Total reward (mean ± std over the step's completions)")
    _finish(fig, [ax], out / "reward.png", ["reward"])
    return Plot("reward.png", "Total reward", "Weighted sum of all reward functions; the band is ± one std.")


def _plot_reward_functions(m: Metrics, out: Path) -> Plot | None:
    names = [n for n in m.reward_functions() if m.has(f"rewards/{n}/mean")]
    if not names:
        return None
    fig, (ax,) = _new_figure()
    for name in names:
        mean = m.series(f"rewards/{name}/mean")
        line = _line(ax, mean, name)
        std = m.series(f"rewards/{name}/std")
        if std.present:
            _band(ax, mean, std, line.get_color())
    ax.set_title("Reward per function (mean ± std)")
    _finish(fig, [ax], out / "reward_functions.png", ["reward"])
    return Plot("reward_functions.png", "Reward per function", "Each reward function on its own (unweighted).")


def _plot_lengths(m: Metrics, out: Path) -> Plot | None:
    keys = ["completions/mean_length", "completions/min_length", "completions/max_length"]
    if not m.has(*keys):
        return None
    fig, (ax,) = _new_figure()
    lo, hi = m.series(keys[1]), m.series(keys[2])
    if lo.present and hi.present:
        ax.fill_between(lo.steps, lo.values, hi.values, color="tab:blue", alpha=0.12, linewidth=0)
    for key, label, style in zip(keys, ("mean", "min", "max"), ("-", ":", "--")):
        if m.series(key).present:
            _line(ax, m.series(key), label, marker_limit=60 if label == "mean" else 1, linestyle=style,
                  color="tab:blue")
    ax.set_title("Completion length (tokens)")
    _finish(fig, [ax], out / "completion_length.png", ["tokens"])
    return Plot("completion_length.png", "Completion length", "Mean, shortest and longest completion of each step.")


def make_plots(m: Metrics, out: Path) -> list[Plot]:
    """Write every plot whose metrics exist; return them in page order."""
    clip = [("clip_ratio/low_mean", "low (ratio < 1 - ε)"), ("clip_ratio/high_mean", "high (ratio > 1 + ε_high)"),
            ("clip_ratio/region_mean", "any")]
    plots = [
        _plot_reward(m, out),
        _plot_reward_functions(m, out),
        _plot_lines(m, out, "kl.png", "KL to the reference policy", "k3 estimate, mean over completion tokens.",
                    [("KL", [("kl", "kl")])]),
        _plot_lines(m, out, "loss.png", "Loss", "The policy loss that was back-propagated.",
                    [("loss", [("loss", "loss")])]),
        _plot_lengths(m, out),
        _plot_lines(m, out, "fractions.png", "Truncated completions and uninformative groups",
                    "Share of completions cut at max_completion_length, and of groups whose rewards were all "
                    "equal (zero advantage, no learning signal).",
                    [("fraction", [("completions/clipped_ratio", "truncated completions"),
                                   ("frac_reward_zero_std", "groups with zero reward std")])]),
        _plot_lines(m, out, "entropy.png", "Entropy", "Mean token entropy of the policy on its completions.",
                    [("nats", [("entropy", "entropy")])]),
        _plot_lines(m, out, "clip_ratio.png", "Clipped importance ratios", "Fraction of tokens whose ratio was clipped.",
                    [("fraction", clip)]),
        _plot_lines(m, out, "optimizer.png", "Learning rate and gradient norm",
                    "Scheduled learning rate, and the global gradient norm before clipping.",
                    [("learning rate", [("learning_rate", "learning rate")]), ("grad norm", [("grad_norm", "grad norm")])]),
        _plot_lines(m, out, "throughput.png", "Generation throughput", "Completion tokens generated per second.",
                    [("tokens / s", [("gen/tokens_per_s", "tokens/s")])]),
        _plot_lines(m, out, "time.png", "Time per step", "Wall time of the whole step and of generation in it.",
                    [("seconds", [("time/step_s", "step"), ("time/generate_s", "generation")])]),
        _plot_lines(m, out, "memory.png", "Peak memory", "Peak GPU memory allocated (CUDA) or peak RSS (CPU).",
                    [("MiB", [("memory/peak_mib", "peak memory")])]),
    ]
    return [p for p in plots if p is not None]


# ----------------------------------------------------------------------------- HTML pieces


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _text_block(content: Any) -> str:
    """A prompt or completion: plain text, or a conversation shown message by message."""
    if isinstance(content, list) and all(isinstance(x, dict) for x in content):
        return "".join(
            f'<div class="msg"><span class="role">{_esc(x.get("role", "?"))}</span>'
            f"<pre>{_esc(_cut(x.get('content', '')))}</pre></div>"
            for x in content
        )
    return f"<pre>{_esc(_cut(content if isinstance(content, str) else json.dumps(content)))}</pre>"


def _cut(text: Any) -> str:
    text = text if isinstance(text, str) else json.dumps(text)
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n… ({len(text) - MAX_TEXT_CHARS} more characters in completions.jsonl)"


def _kv_grid(rows: list[tuple[str, Any]]) -> str:
    """Name/value pairs flowing in newspaper columns, so a long summary stays a few lines tall."""
    body = "".join(f'<div class="kv"><span class="k">{_esc(k)}</span><span class="v">{_esc(_fmt(v))}</span></div>'
                   for k, v in rows)
    return f'<div class="kv-grid">{body}</div>'


def summary_section(summary: dict[str, Any], m: Metrics) -> str:
    parts = []
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        parts.append(
            f'<p class="headline">Held-out accuracy: <b>{before:.1%}</b> before training → '
            f"<b>{after:.1%}</b> after ({(after - before) * 100:+.1f} points).</p>"
        )
    if summary:
        rows = list(summary.items())
        source = "summary.json"
    else:  # a run still going, or one that crashed before writing summary.json
        last = m.records[-1]
        rows = [("steps logged", len(m.records))] + [(k, v) for k, v in last.items()]
        source = "the last record of metrics.jsonl (no summary.json yet)"
    skipped = sum(1 for r in m.records if r.get("update_skipped") is True)
    if skipped:
        rows.append(("steps with a skipped update (non-finite loss or gradient)", skipped))
    faults: dict[str, float] = {}
    for r in m.records:
        for k, v in r.items():
            if k.startswith("reward_faults/") and isinstance(v, (int, float)):
                faults[k[len("reward_faults/"):]] = faults.get(k[len("reward_faults/"):], 0) + v
    parts.append(f'<p class="note">From {_esc(source)}.</p>' + _kv_grid(rows))
    if faults:
        parts.append("<h3>Reward function faults (summed over the run)</h3>" + _kv_grid(sorted(faults.items())))
    return "".join(parts)


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict) and d:
        out: list[tuple[str, Any]] = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
        return out
    return [(prefix.rstrip("."), d)]


def _config_defaults() -> dict[str, Any]:
    try:
        from slimgrpo.config import iter_fields

        return {key: default for key, _, default, _ in iter_fields()}
    except Exception:  # the report must still work if the config module changed shape
        return {}


def config_section(run_dir: Path) -> str:
    import yaml

    from slimgrpo.secrets import scrub

    path = run_dir / "config.yaml"
    if not path.is_file():
        return '<p class="note">No config.yaml in the run folder.</p>'
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        return f"<pre class='config'>{_esc(text)}</pre>"
    defaults = _config_defaults()
    sections: dict[str, list[str]] = {}
    for key, value in _flatten(scrub(data)):
        changed = key in defaults and defaults[key] != value
        cls = ' class="changed"' if changed else ""
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        sections.setdefault(key.split(".")[0], []).append(
            f"<tr{cls}><td><code>{_esc(key)}</code></td><td><code>{_esc(shown)}</code></td></tr>")
    tables = "".join(f'<table class="config"><tr class="section"><th colspan="2">{_esc(head)}</th></tr>'
                     f'{"".join(rows)}</table>' for head, rows in sections.items())
    return ('<p class="note">Resolved config of the run; <span class="changed-key">highlighted</span> '
            "rows differ from slimgrpo's defaults.</p>"
            f'<div class="config-grid">{tables}</div>')


def _pick_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first logged step (what the untrained model wrote) and then the newest samples."""
    if len(samples) <= MAX_SAMPLES:
        return samples
    first_step = samples[0].get("step")
    first = [s for s in samples if s.get("step") == first_step][: MAX_SAMPLES // 4]
    rest = [s for s in samples if s.get("step") != first_step][-(MAX_SAMPLES - len(first)):]
    return first + rest


def samples_section(run_dir: Path) -> str:
    from slimgrpo.secrets import scrub

    path = run_dir / "completions.jsonl"
    if not path.is_file():
        return '<p class="note">No completions.jsonl (set log.log_completions_steps to log samples).</p>'
    samples = [scrub(s) for s in read_jsonl(path)]
    if not samples:
        return '<p class="note">completions.jsonl is empty.</p>'
    shown = _pick_samples(samples)
    reward_keys: list[str] = []
    for s in shown:
        reward_keys += [k for k in s if k.startswith("reward/") and k not in reward_keys]
    head = ["step", "group", "prompt", "completion", "reward", *(k[7:] for k in reward_keys), "advantage"]
    rows = []
    for s in shown:
        adv = s.get("advantage")
        sign = "pos" if isinstance(adv, (int, float)) and adv > 0 else "neg" if isinstance(adv, (int, float)) and adv < 0 else ""
        cells = [f"<td>{_esc(_fmt(s.get('step')))}</td>", f"<td>{_esc(_fmt(s.get('group')))}</td>",
                 f'<td class="text">{_text_block(s.get("prompt", ""))}</td>',
                 f'<td class="text">{_text_block(s.get("completion", ""))}</td>',
                 f'<td class="num">{_esc(_fmt(s.get("reward")))}</td>',
                 *(f'<td class="num">{_esc(_fmt(s.get(k)))}</td>' for k in reward_keys),
                 f'<td class="num {sign}">{_esc(_fmt(adv))}</td>']
        rows.append(f"<tr>{''.join(cells)}</tr>")
    note = f"Showing {len(shown)} of {len(samples)} logged completions" + (
        " (the first logged step, then the newest)." if len(shown) < len(samples) else ".")
    header = "".join(f"<th>{_esc(h)}</th>" for h in head)
    return (f'<p class="note">{_esc(note)}</p><div class="scroll"><table class="samples">'
            f"<thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1400px;
 padding:1.5rem 2rem;color:#1d2329;background:#fff;line-height:1.45}
h1{font-size:1.6rem;margin:.2rem 0}h2{margin-top:2.2rem;border-bottom:2px solid #e3e7eb;padding-bottom:.3rem}
.note{color:#5b6670;font-size:.9rem}.headline{font-size:1.15rem;background:#eef6ee;padding:.6rem .9rem;
 border-left:4px solid #3c9a3c}
nav a{margin-right:1rem}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1.2rem}
figure{margin:0;border:1px solid #e3e7eb;border-radius:6px;padding:.5rem;background:#fafbfc}
figure img{width:100%;height:auto;display:block}figcaption{font-size:.85rem;color:#5b6670;margin-top:.3rem}
table{border-collapse:collapse;font-size:.88rem}th,td{border:1px solid #dde2e6;padding:.3rem .5rem;
 vertical-align:top;text-align:left}
.kv-grid{columns:300px;column-gap:2rem;font-size:.9rem}.kv{display:flex;justify-content:space-between;gap:1rem;
 break-inside:avoid;border-bottom:1px solid #eceff2;padding:.18rem 0}.kv .k{color:#3d4750}
.kv .v{font-weight:600;font-variant-numeric:tabular-nums}
.config-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:1rem;align-items:start}
table.config{width:100%}table.config tr.section th{background:#e9eef3;font-size:.95rem}table.config tr.changed td,
.changed-key{background:#fff5d6}
.scroll{overflow-x:auto}table.samples{width:100%}table.samples thead th{background:#f4f6f8;position:sticky;top:0}
td.text{min-width:18rem;max-width:40rem}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.pos{color:#1f7a1f}td.neg{color:#b3261e}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.82rem;font-family:ui-monospace,Menlo,Consolas,monospace}
.msg{margin-bottom:.3rem}.role{font-size:.75rem;font-weight:600;color:#5b6670;text-transform:uppercase}
"""


def render_page(run_dir: Path, m: Metrics, plots: list[Plot], summary: dict[str, Any]) -> str:
    name = run_dir.resolve().name
    steps = [s for s in m.steps if not math.isnan(s)]
    span = f"steps {int(min(steps))}–{int(max(steps))}" if steps else "no steps"
    figures = "".join(
        f'<figure><img src="{_esc(p.filename)}" alt="{_esc(p.title)}">'
        f"<figcaption><b>{_esc(p.title)}.</b> {_esc(p.caption)}</figcaption></figure>"
        for p in plots
    ) or '<p class="note">No plottable metrics yet.</p>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>slimgrpo report: {_esc(name)}</title><style>{CSS}</style></head>
<body>
<h1>slimgrpo run report: {_esc(name)}</h1>
<p class="note">{_esc(str(run_dir.resolve()))} · {len(m.records)} metric records · {_esc(span)}</p>
<nav><a href="#summary">Summary</a><a href="#plots">Plots</a><a href="#samples">Sample completions</a>
<a href="#config">Config</a></nav>
<h2 id="summary">Summary</h2>{summary_section(summary, m)}
<h2 id="plots">Plots</h2><div class="plots">{figures}</div>
<h2 id="samples">Sample completions</h2>{samples_section(run_dir)}
<h2 id="config">Config</h2>{config_section(run_dir)}
</body></html>
"""


# ----------------------------------------------------------------------------- entry points


def build_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report/*.png`` and ``RUN_DIR/report/index.html``; return the page's path."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise ValueError(f"run folder {str(run_dir)!r} does not exist")
    if not metrics_path.is_file():
        raise ValueError(
            f"{str(metrics_path)!r} does not exist: `slimgrpo report` needs a run folder written by "
            "`slimgrpo train` (its run.output_dir)"
        )
    m = Metrics(read_jsonl(metrics_path))
    if not m.records:
        raise ValueError(f"{str(metrics_path)!r} holds no records yet: nothing to report")
    summary: dict[str, Any] = {}
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        try:
            loaded = json.loads(summary_path.read_text())
            summary = loaded if isinstance(loaded, dict) else {}
        except json.JSONDecodeError:
            log.warning("%s is not valid JSON; summarising from metrics.jsonl instead", summary_path)

    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # plots of metrics that vanished must not linger
        old.unlink()
    plots = make_plots(m, out)
    page = out / "index.html"
    page.write_text(render_page(run_dir, m, plots, summary), encoding="utf-8")
    return page


def report_command(args) -> int:
    page = build_report(args.run_dir)
    print(page)
    return 0
