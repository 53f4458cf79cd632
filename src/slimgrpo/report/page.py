"""One run's report page: HTML pieces (summary, eval headline, deltas, samples, config), the page shell
with its inline CSS, and ``build_report`` (``RUN_DIR/report/index.html`` and the PNGs beside it).

Every piece of run text is HTML-escaped (completions are model output); plots are relative <img> links.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from slimgrpo.report.data import (Metrics, config_value, deltas, is_share, load_run, read_jsonl, run_status, stalls,
                                  value_ranges)
from slimgrpo.report.plots import Plot, Run, make_plots

REPORT_DIR = "report"
MAX_SAMPLES = 48  # completions shown on the page (the first logged step, then the newest)
MAX_TEXT_CHARS = 4000  # longer prompts/completions are cut on the page (the JSONL keeps them whole)


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
    """A prompt or completion: plain text, or a whole conversation shown message by message (role, content,
    and any tool calls), as completions.jsonl stores multi-turn and tool-using episodes."""
    if isinstance(content, list) and content and all(isinstance(x, dict) for x in content):
        out = []
        for x in content:
            role = str(x.get("role", "?"))
            body = x.get("content")
            if isinstance(body, list):  # content parts: [{"type": "text", "text": ...}, ...]
                body = "\n".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in body)
            extra = {k: v for k, v in x.items() if k not in ("role", "content")}
            extras = f"<pre class='extra'>{_esc(_cut(json.dumps(extra, indent=1)))}</pre>" if extra else ""
            text = f"<pre>{_esc(_cut(body))}</pre>" if body not in (None, "") else ""
            out.append(f'<div class="msg {_esc(role)}"><span class="role">{_esc(role)}</span>{text}{extras}</div>')
        return "".join(out)
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


def _decimals(*values: float) -> int | None:
    """Decimals that show values of this size with about three significant digits (None: too small or too
    large for fixed point)."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if top == 0:
        return 3
    if top < 1e-3 or top >= 1e6:
        return None
    return max(0, 2 - math.floor(math.log10(top)))


def pair_text(label: str, a: float, b: float) -> tuple[str, str]:
    """A first/last pair in one format: shares as percentages, other numbers with the same decimals (so
    ``0.000 -> 0.250`` and ``0.273 -> 0.650`` read alike)."""
    if is_share(label):
        return f"{a:.1%}", f"{b:.1%}"
    d = _decimals(a, b)
    return (f"{a:.3e}", f"{b:.3e}") if d is None else (f"{a:.{d}f}", f"{b:.{d}f}")


def signed(d: float) -> str:
    """A change with two significant digits: +0.075, -12, +1.2e-05."""
    if d == 0 or not math.isfinite(d):
        return "0" if d == 0 else "—"
    if not 1e-3 <= abs(d) < 1e6:
        return f"{d:+.1e}"
    return f"{d:+.{max(0, 1 - math.floor(math.log10(abs(d))))}f}"


def eval_headline(m: Metrics, summary: dict[str, Any]) -> str:
    """Held-out accuracy before -> after, from the eval/ records of metrics.jsonl (any run with eval.data), or
    the summary's ``eval_before``/``eval_after`` (runs written before eval.* existed)."""
    parts = []
    for key, label in (("eval/accuracy_greedy", "greedy"), ("eval/accuracy_sampled", "sampled")):
        s = m.series(key)
        pts = [(st, v) for st, v in zip(m.steps, s.values) if v == v]
        if not pts:
            continue
        (s0, before), (s1, after) = pts[0], pts[-1]
        if len(pts) > 1:
            parts.append(f"{label} <b>{before:.1%}</b> at step {int(s0)} → <b>{after:.1%}</b> at step {int(s1)} "
                         f"({(after - before) * 100:+.1f} points)")
        else:
            parts.append(f"{label} <b>{after:.1%}</b> at step {int(s1)}")
    if parts:
        return f'<p class="headline">Held-out accuracy: {"; ".join(parts)}.</p>'
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return (f'<p class="headline">Held-out accuracy: <b>{before:.1%}</b> before training → '
                f"<b>{after:.1%}</b> after ({(after - before) * 100:+.1f} points).</p>")
    return ""


def deltas_table(m: Metrics, skip: tuple[str, ...] = ()) -> str:
    rows = "".join(
        f"<tr><td>{_esc(label)}</td>" + "".join(f"<td class='num'>{_esc(t)}</td>" for t in pair_text(label, a, b))
        + f"<td class='num'>{_esc(_change(label, a, b))}</td></tr>"
        for label, a, b in deltas(m) if label not in skip)
    if not rows:
        return ""
    return ('<table class="deltas"><thead><tr><th>metric</th><th>first</th><th>last</th><th>change</th></tr>'
            f"</thead><tbody>{rows}</tbody></table>"
            '<p class="note">Training metrics smoothed (EMA) before taking the first and last values; held-out '
            "accuracy as measured.</p>")


def _change(label: str, a: float, b: float) -> str:
    if is_share(label):
        return f"{(b - a) * 100:+.1f} points"
    return signed(b - a)


def stall_section(m: Metrics) -> str:
    """Stretches where learning stalled (monitor/stall.py): steps and the reason the run gave."""
    items = "".join(f"<li><b>Learning stalled at steps {a}–{b}</b> (shaded on the reward plot). {_esc(why)}</li>"
                    for a, b, why in stalls(m))
    return f'<ul class="notes stall">{items}</ul>' if items else ""


def summary_section(summary: dict[str, Any], m: Metrics, config: dict[str, Any] | None = None) -> str:
    kind, sentence = run_status(m, summary, config)
    parts = [f'<p class="status {kind}">{_esc(sentence)}</p>', stall_section(m), eval_headline(m, summary),
             deltas_table(m, ("KL to reference",) if config_value(config, "loss.beta") == 0 else ())]
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
    if faults:
        parts.append("<h3>Reward function faults (summed over the run)</h3>" + _kv_grid(sorted(faults.items())))
    parts.append(f'<details><summary>Every value of {_esc(source)} ({len(rows)})</summary>{_kv_grid(rows)}'
                 "</details>")
    return "".join(parts)


def config_notes(config: dict[str, Any] | None, m: Metrics) -> list[str]:
    """Why a metric the reader might look for is missing or flat: it is off by configuration."""
    notes = []
    beta = config_value(config, "loss.beta")
    if isinstance(beta, (int, float)) and beta == 0:
        notes.append("KL not computed: loss.beta=0 (no reference model; set loss.beta=0.04 to track and "
                     "penalise the drift from the initial policy).")
    if config is not None and not config_value(config, "eval.data") and not m.has("eval/accuracy_greedy"):
        notes.append("No held-out evaluation: set eval.data=heldout.jsonl to measure accuracy before, during and "
                     "after training.")
    clip = m.series("clip_ratio/region_mean").finite
    if config_value(config, "loss.num_iterations") == 1 and clip and max(clip) == 0:
        notes.append("Clipped ratios are zero by construction: with loss.num_iterations=1 every update is "
                     "on-policy, so the importance ratio is exactly 1.")
    return notes


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


def _shown(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def config_section(run_dir: Path) -> str:
    import yaml

    from slimgrpo.redact import scrub

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
    changed_rows, sections = [], {}
    for key, value in _flatten(scrub(data)):
        changed = key in defaults and defaults[key] != value
        cls = ' class="changed"' if changed else ""
        row = f"<tr{cls}><td><code>{_esc(key)}</code></td><td><code>{_esc(_shown(value))}</code></td></tr>"
        sections.setdefault(key.split(".")[0], []).append(row)
        if changed:
            changed_rows.append(f"<tr><td><code>{_esc(key)}</code></td><td><code>{_esc(_shown(value))}</code></td>"
                                f"<td><code>{_esc(_shown(defaults[key]))}</code></td></tr>")
    changed = ('<table class="config changed-table"><colgroup><col class="k"><col><col></colgroup><thead><tr>'
               "<th>changed key</th><th>this run</th><th>default</th></tr></thead>"
               f'<tbody>{"".join(changed_rows)}</tbody></table>') if changed_rows else \
        '<p class="note">Every key has its default value.</p>'
    tables = "".join(f'<table class="config"><colgroup><col class="k"><col></colgroup><tr class="section">'
                     f'<th colspan="2">{_esc(head)}</th></tr>{"".join(rows)}</table>' for head, rows in sections.items())
    return (f'<p class="note">The run\'s resolved config: {len(changed_rows)} keys differ from slimgrpo\'s '
            "defaults.</p>" + changed +
            f'<details><summary>All keys, by section</summary><div class="config-grid">{tables}</div></details>')


def _pick_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first logged step (what the untrained model wrote) and then the newest samples."""
    if len(samples) <= MAX_SAMPLES:
        return samples
    first_step = samples[0].get("step")
    first = [s for s in samples if s.get("step") == first_step][: MAX_SAMPLES // 4]
    rest = [s for s in samples if s.get("step") != first_step][-(MAX_SAMPLES - len(first)):]
    return first + rest


def samples_section(run_dir: Path) -> str:
    from slimgrpo.redact import scrub

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
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1400px;
 padding:1.5rem 2rem;color:#1d2329;background:#fff;line-height:1.45}
h1{font-size:1.6rem;margin:.2rem 0}h2{margin-top:2.2rem;border-bottom:2px solid #e3e7eb;padding-bottom:.3rem}
.note{color:#5b6670;font-size:.9rem}.headline{font-size:1.15rem;background:#eef6ee;padding:.6rem .9rem;
 border-left:4px solid #3c9a3c}
.status{font-size:1.05rem;font-weight:600;padding:.4rem .9rem;border-left:4px solid #888;background:#f4f6f8}
.status.complete{border-color:#3c9a3c}.status.stopped{border-color:#d08a00;background:#fff7e6}
.status.running{border-color:#2f6fb5;background:#eef4fb}
ul.notes{background:#fffbea;border:1px solid #f0e2a8;border-radius:6px;padding:.5rem 1.8rem;font-size:.9rem}
nav a{margin-right:1rem}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1.2rem}
figure{margin:0;border:1px solid #e3e7eb;border-radius:6px;padding:.5rem;background:#fafbfc;min-width:0}
figure img{width:100%;height:auto;display:block}figcaption{font-size:.85rem;color:#5b6670;margin-top:.3rem}
table{border-collapse:collapse;font-size:.88rem}th,td{border:1px solid #dde2e6;padding:.3rem .5rem;
 vertical-align:top;text-align:left;overflow-wrap:anywhere}
table.deltas{margin:.8rem 0}table.deltas td.num{min-width:6rem}
.kv-grid{columns:300px;column-gap:2rem;font-size:.9rem}.kv{display:flex;justify-content:space-between;gap:1rem;
 break-inside:avoid;border-bottom:1px solid #eceff2;padding:.18rem 0}.kv .k{color:#3d4750;overflow-wrap:anywhere}
.kv .v{font-weight:600;font-variant-numeric:tabular-nums;overflow-wrap:anywhere;text-align:right}
details{margin:.8rem 0}summary{cursor:pointer;color:#2f6fb5}
.config-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:1rem;align-items:start}
table.config{width:100%;table-layout:fixed}table.config col.k{width:45%}
table.changed-table col.k{width:34%}table.config tr.section th{background:#e9eef3;font-size:.95rem}
table.config tr.changed td,.changed-key{background:#fff5d6}table.config code{white-space:pre-wrap}
.scroll{overflow-x:auto}table.samples{width:100%}table.samples thead th{background:#f4f6f8;position:sticky;top:0}
td.text{min-width:18rem;max-width:40rem}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.pos{color:#1f7a1f}td.neg{color:#b3261e}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font-size:.82rem;font-family:ui-monospace,Menlo,Consolas,monospace}
.msg{margin-bottom:.35rem;padding:.2rem .4rem;border-left:3px solid #dde2e6}.msg.assistant{border-color:#7aa7d9}
.msg.tool{border-color:#c9a54a}.msg.system{border-color:#aaa}.msg.user{border-color:#8bc48b}
.role{font-size:.75rem;font-weight:600;color:#5b6670;text-transform:uppercase}
"""


def _notes_html(notes: list[str]) -> str:
    return ('<ul class="notes">' + "".join(f"<li>{_esc(n)}</li>" for n in notes) + "</ul>") if notes else ""


def figures_html(plots: list[Plot]) -> str:
    return "".join(
        f'<figure><img src="{_esc(p.filename)}" alt="{_esc(p.title)}">'
        f"<figcaption><b>{_esc(p.title)}.</b> {_esc(p.caption)}</figcaption></figure>"
        for p in plots
    ) or '<p class="note">No plottable metrics yet.</p>'


def page_html(title: str, subtitle: str, nav: list[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="#{_esc(a)}">{_esc(t)}</a>' for a, t in nav)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}</title><style>{CSS}</style></head>
<body>
<h1>{_esc(title)}</h1>
<p class="note">{_esc(subtitle)}</p>
<nav>{links}</nav>
{body}
</body></html>
"""


def render_page(run_dir: Path, m: Metrics, plots: list[Plot], summary: dict[str, Any],
                config: dict[str, Any] | None = None) -> str:
    name = run_dir.resolve().name
    steps = [s for s in m.steps if not math.isnan(s)]
    span = f"steps {int(min(steps))}–{int(max(steps))}" if steps else "no steps"
    x = "" if m.x_kind == "step" else " · x axis: training time"
    body = (f'<h2 id="summary">Summary</h2>{summary_section(summary, m, config)}'
            f'<h2 id="plots">Plots</h2>{_notes_html(config_notes(config, m))}<div class="plots">{figures_html(plots)}</div>'
            f'<h2 id="samples">Sample completions</h2>{samples_section(run_dir)}'
            f'<h2 id="config">Config</h2>{config_section(run_dir)}')
    return page_html(f"slimgrpo run report: {name}",
                     f"{run_dir.resolve()} · {len(m.records)} metric records · {span}{x}",
                     [("summary", "Summary"), ("plots", "Plots"), ("samples", "Sample completions"),
                      ("config", "Config")], body)


# ----------------------------------------------------------------------------- entry points


def _fresh_dir(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # plots of metrics that vanished must not linger
        old.unlink()


def build_report(run_dir: str | Path, x: str = "step") -> Path:
    """Write ``RUN_DIR/report/*.png`` and ``RUN_DIR/report/index.html``; return the page's path."""
    run_dir = Path(run_dir)
    m, summary, config = load_run(run_dir, x)
    out = run_dir / REPORT_DIR
    _fresh_dir(out)
    beta_zero = config_value(config, "loss.beta") == 0  # no reference model: the kl column is a placeholder
    plots = make_plots([Run(run_dir.resolve().name, m, value_ranges(run_dir))], out, beta_zero=beta_zero)
    page = out / "index.html"
    page.write_text(render_page(run_dir, m, plots, summary, config), encoding="utf-8")
    return page
