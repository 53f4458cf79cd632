"""The report's figures: matplotlib (Agg, no pyplot), 2x resolution for HiDPI screens, raw values faint and
an EMA bold, ± std bands clipped to the range the values can take, one small panel per reward function, and
one colour per run when several runs are overlaid."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from slimgrpo.report.data import Metrics, Series, best_step, early_stop_span, stalls, step_to_x

DPI = 200  # 6.4 in wide -> 1280 px, shown at ~640 CSS px: sharp on 2x screens
RUN_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]


@dataclass
class Plot:
    filename: str
    title: str
    caption: str


@dataclass
class Run:
    """One run on a figure: its label and metrics."""

    label: str
    metrics: Metrics
    value_range: dict[str, tuple[float, float]]  # reward key -> (lowest, highest) value seen in samples


def new_figure(nrows: int = 1, ncols: int = 1, height: float | None = None):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h = height or (3.4 if nrows == 1 else 1.9 + 1.5 * nrows)
    fig = Figure(figsize=(6.4, h), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def draw(ax, s: Series, label: str | None, color=None, smooth: bool = True, **kw):
    """Raw values (faint when smoothed) and their EMA (bold); markers when points are few."""
    n = len(s.finite)
    sm = s.smoothed() if smooth else s
    if smooth and sm.values != s.values:
        ax.plot(s.steps, s.values, color=color, alpha=0.25, linewidth=0.8, **kw)
        return ax.plot(sm.steps, sm.values, color=color, linewidth=2.0, label=label, **kw)[0]
    return ax.plot(s.steps, s.values, color=color, label=label, marker="o" if n <= 60 else None,
                   markersize=3.5, linewidth=1.6, **kw)[0]


def band(ax, mean: Series, spread: Series, color, bounds: tuple[float, float] | None) -> None:
    """mean ± std, smoothed like the line, clipped to ``bounds`` (a 0/1 reward's band stays in [0, 1])."""
    m, s = mean.smoothed().values, spread.smoothed().values
    lo = [a - b for a, b in zip(m, s)]
    hi = [a + b for a, b in zip(m, s)]
    if bounds:
        lo = [min(max(v, bounds[0]), bounds[1]) if not math.isnan(v) else v for v in lo]
        hi = [min(max(v, bounds[0]), bounds[1]) if not math.isnan(v) else v for v in hi]
    ax.fill_between(mean.steps, lo, hi, color=color, alpha=0.15, linewidth=0)


def steady_axis(ax) -> None:
    """A panel whose lines are all one constant value (a constant learning rate): a sane y-range around it and
    one tick labelled with the value, not an offset scale of rounding noise (0.000285 .. 0.000315)."""
    values = [float(v) for line in ax.get_lines() for v in line.get_ydata() if math.isfinite(float(v))]
    if not values:
        return
    lo, hi = min(values), max(values)
    if hi - lo > 1e-9 * max(abs(hi), abs(lo), 1e-300):
        return
    v = hi
    pad = abs(v) * 0.5 if v else 1.0
    ax.set_ylim(v - pad, v + pad)
    ax.set_yticks([v])
    ax.set_yticklabels([f"{v:.3g}"])
    ax.text(0.99, 0.9, f"constant: {v:.3g}", transform=ax.transAxes, ha="right", va="top", fontsize="small",
            color="0.35")


def finish(fig, axes, path: Path, ylabels: list[str], xlabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        steady_axis(ax)
    for ax, ylabel in zip(axes, ylabels):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if any(line.get_label() and not line.get_label().startswith("_") for line in ax.get_lines()) and \
                len([ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]) > 1:
            ax.legend(fontsize="small")
    for ax in axes:
        if ax.get_subplotspec().is_last_row():
            ax.set_xlabel(xlabel)
            if xlabel == "step":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.savefig(path)


def _xlabel(runs: list[Run]) -> str:
    return "step" if runs[0].metrics.x_kind == "step" else "training time (min)"


def _colour(runs: list[Run], i: int, default):
    return RUN_COLOURS[i % len(RUN_COLOURS)] if len(runs) > 1 else default


def plot_lines(runs: list[Run], out: Path, filename: str, title: str, caption: str,
               panels: list[tuple[str, list[tuple[str, str]]]]) -> Plot | None:
    """A figure with one panel per (ylabel, [(key, label), ...]); keys without data are dropped."""
    panels = [(yl, [(k, lb) for k, lb in keys if any(r.metrics.has(k) for r in runs)]) for yl, keys in panels]
    panels = [(yl, keys) for yl, keys in panels if keys]
    if not panels:
        return None
    fig, axes = new_figure(len(panels))
    for ax, (_, keys) in zip(axes, panels):
        for j, (key, label) in enumerate(keys):
            for i, run in enumerate(runs):
                if not run.metrics.has(key):
                    continue
                name = label if len(runs) == 1 else (f"{run.label}: {label}" if len(keys) > 1 else run.label)
                color = _colour(runs, i, f"C{j}")
                draw(ax, run.metrics.series(key), name, color, linestyle=["-", "--", ":"][j % 3] if len(runs) > 1
                     else "-")
    axes[0].set_title(title)
    finish(fig, axes, out / filename, [yl for yl, _ in panels], _xlabel(runs))
    return Plot(filename, title, caption)


def _bounds(run: Run, key: str, mean: Series) -> tuple[float, float] | None:
    """The range a reward's band may cover: the lowest and highest value the logged completions got (widened by
    the per-step means); without logged completions, [0, 1] when every mean lies in it, else no clipping."""
    vals = mean.finite
    if not vals:
        return None
    if key in run.value_range:
        lo, hi = run.value_range[key]
        lo, hi = min(lo, *vals), max(hi, *vals)
        if lo >= 0 and hi <= 1:
            return 0.0, 1.0  # a score in [0, 1] (e.g. 0/1 correctness): the band never leaves it
        return (lo, hi) if hi > lo else None
    return (0.0, 1.0) if min(vals) >= 0 and max(vals) <= 1 else None


def shade_stalls(ax, runs: list[Run]) -> bool:
    """Shade each stretch where learning stalled (monitor/stall.py), in the run's colour when several runs are
    drawn; True when there was one."""
    shaded = False
    for i, run in enumerate(runs):
        m = run.metrics
        half = 0.5 if m.x_kind == "step" else 0.0
        for a, b, _ in stalls(m):
            ax.axvspan(step_to_x(m, a) - half, step_to_x(m, b) + half, color=_colour(runs, i, "tab:red"),
                       alpha=0.13, linewidth=0, label=None if shaded else "learning stalled")
            shaded = True
    return shaded


def mark_best(ax, runs: list[Run]) -> bool:
    """run.keep_best: a dashed line at the step whose model final/ holds, and the stretch early stopping
    found no improvement in shaded (best step to stop step); True when there was either."""
    marked = False
    for i, run in enumerate(runs):
        m = run.metrics
        best = best_step(m)
        if best is None:
            continue
        ax.axvline(step_to_x(m, best[0]), color=_colour(runs, i, "tab:green"), linestyle="--", linewidth=1.2,
                   label=None if marked else "best model (kept as final/)")
        span = early_stop_span(m)
        if span is not None:
            ax.axvspan(step_to_x(m, span[0]), step_to_x(m, span[1]), color=_colour(runs, i, "tab:orange"),
                       alpha=0.12, linewidth=0, label=None if marked else "no improvement (early stopping)")
        marked = True
    return marked


def plot_reward(runs: list[Run], out: Path) -> Plot | None:
    if not any(r.metrics.has("reward") for r in runs):
        return None
    fig, (ax,) = new_figure()
    for i, run in enumerate(runs):
        mean = run.metrics.series("reward")
        line = draw(ax, mean, "reward (mean)" if len(runs) == 1 else run.label, _colour(runs, i, "tab:blue"))
        if run.metrics.has("reward_std") and len(runs) <= 3:
            band(ax, mean, run.metrics.series("reward_std"), line.get_color(), _bounds(run, "reward", mean))
    stalled = shade_stalls(ax, runs)
    best = mark_best(ax, runs)
    if stalled or best:
        ax.legend(fontsize="small")
    ax.set_title("Total reward (mean ± std over the step's completions)")
    finish(fig, [ax], out / "reward.png", ["reward"], _xlabel(runs))
    return Plot("reward.png", "Total reward", "Weighted sum of all reward functions; bold = smoothed (EMA), faint "
                "= every step; the band is ± one std, clipped to the observed range."
                + (" Shaded: steps where learning stalled (most groups without reward spread, or entropy "
                   "collapsed while the reward was flat or fell; stall/* in metrics.jsonl)." if stalled else "")
                + (" Dashed: the step whose model final/ holds (run.keep_best); orange: the judgements without "
                   "improvement before early stopping." if best else ""))


def plot_reward_functions(runs: list[Run], out: Path) -> Plot | None:
    names: list[str] = []
    for run in runs:
        names += [n for n in run.metrics.reward_functions() if n not in names and run.metrics.has(f"rewards/{n}/mean")]
    if not names:
        return None
    ncols = min(len(names), 3)
    nrows = math.ceil(len(names) / ncols)
    fig, axes = new_figure(nrows, ncols, height=2.4 * nrows + 0.4)
    for ax, name in zip(axes, names):
        for i, run in enumerate(runs):
            key = f"rewards/{name}/mean"
            if not run.metrics.has(key):
                continue
            mean = run.metrics.series(key)
            line = draw(ax, mean, run.label if len(runs) > 1 else None, _colour(runs, i, "tab:green"))
            std = run.metrics.series(f"rewards/{name}/std")
            if std.present and len(runs) <= 3:
                band(ax, mean, std, line.get_color(), _bounds(run, f"reward/{name}", mean))
        ax.set_title(name if len(name) <= 24 else name[:23] + "…", fontsize="medium")
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize="small")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(nbins=4 if ncols > 1 else 8, integer=runs[0].metrics.x_kind == "step"))
    for ax in axes[len(names):]:
        ax.set_visible(False)
    xlabel = _xlabel(runs)
    for ax in axes[: len(names)]:
        if ax.get_subplotspec().is_last_row() or ax is axes[len(names) - 1]:
            ax.set_xlabel(xlabel)
    if len(runs) > 1:
        axes[0].legend(fontsize="x-small")
    fig.suptitle("Reward per function (mean ± std, unweighted)")
    fig.savefig(out / "reward_functions.png")
    return Plot("reward_functions.png", "Reward per function",
                "One panel per reward function, unweighted; bands clipped to the values the function produced.")


def plot_lengths(runs: list[Run], out: Path) -> Plot | None:
    keys = ["completions/mean_length", "completions/min_length", "completions/max_length"]
    if len(runs) > 1:
        return plot_lines(runs, out, "completion_length.png", "Completion length (tokens)",
                          "Mean completion length of each step.", [("tokens", [(keys[0], "mean")])])
    m = runs[0].metrics
    if not m.has(*keys):
        return None
    fig, (ax,) = new_figure()
    lo, hi = m.series(keys[1]).smoothed(), m.series(keys[2]).smoothed()
    if lo.present and hi.present:
        ax.fill_between(lo.steps, lo.values, hi.values, color="tab:blue", alpha=0.12, linewidth=0,
                        label="min – max")
    if m.series(keys[0]).present:
        draw(ax, m.series(keys[0]), "mean", "tab:blue")
    ax.set_title("Completion length (tokens)")
    finish(fig, [ax], out / "completion_length.png", ["tokens"], _xlabel(runs))
    return Plot("completion_length.png", "Completion length", "Mean completion length (bold: smoothed), and the "
                "range from the shortest to the longest completion of each step (smoothed).")


def plot_eval(runs: list[Run], out: Path) -> Plot | None:
    keys: list[tuple[str, str]] = [("eval/accuracy_greedy", "greedy"), ("eval/accuracy_sampled", "sampled")]
    for run in runs:
        keys += [(k, k[5:]) for k in run.metrics.keys if k.startswith("eval/pass@") and (k, k[5:]) not in keys]
    keys = [(k, lb) for k, lb in keys if any(r.metrics.has(k) for r in runs)]
    if not keys:
        return None
    fig, (ax,) = new_figure()
    for i, run in enumerate(runs):
        for j, (key, label) in enumerate(keys):
            if not run.metrics.has(key):
                continue
            s = run.metrics.series(key)
            pts = [(x, v) for x, v in zip(s.steps, s.values) if not math.isnan(v)]
            name = label if len(runs) == 1 else f"{run.label}: {label}"
            color = _colour(runs, i, f"C{j}")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4, linewidth=1.8,
                    linestyle=["-", "--", ":"][j % 3], color=color, label=name)
    if mark_best(ax, runs):
        ax.legend(fontsize="small")
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(_percent())
    ax.set_title("Held-out evaluation (eval.data)")
    finish(fig, [ax], out / "eval.png", ["accuracy"], _xlabel(runs))
    return Plot("eval.png", "Held-out accuracy", "Greedy (temperature 0) and sampled accuracy, and pass@k, on the "
                "eval.data prompts: before the first step, every eval.steps steps and at the end.")


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0, decimals=0)


def make_plots(runs: list[Run], out: Path, beta_zero: bool = False) -> list[Plot]:
    """Write every plot whose metrics exist; return them in page order."""
    clip = [("clip_ratio/low_mean", "low (ratio < 1 - ε)"), ("clip_ratio/high_mean", "high (ratio > 1 + ε_high)"),
            ("clip_ratio/region_mean", "any")]
    plots = [
        plot_eval(runs, out),
        plot_reward(runs, out),
        plot_reward_functions(runs, out),
        None if beta_zero else plot_lines(runs, out, "kl.png", "KL to the reference policy",
                                          "k3 estimate, mean over completion tokens.", [("KL", [("kl", "kl")])]),
        plot_lines(runs, out, "loss.png", "Loss", "The policy loss that was back-propagated.",
                   [("loss", [("loss", "loss")])]),
        plot_lines(runs, out, "value.png", "PPO's critic", "Clipped value loss (token mean, before vf_coef) and the "
                   "explained variance of the critic's values at sampling time against the GAE returns (1 = a "
                   "perfect critic, 0 = no better than the mean).",
                   [("value loss", [("value/loss", "value loss")]),
                    ("explained variance", [("value/explained_variance", "explained variance")])]),
        plot_lengths(runs, out),
        plot_lines(runs, out, "fractions.png", "Truncated completions and uninformative groups",
                   "Share of completions cut at max_completion_length, and of groups whose rewards were all "
                   "equal (zero advantage, no learning signal).",
                   [("fraction", [("completions/clipped_ratio", "truncated completions"),
                                  ("frac_reward_zero_std", "groups with zero reward std")])]),
        plot_lines(runs, out, "entropy.png", "Entropy", "Mean token entropy of the policy on its completions.",
                   [("nats", [("entropy", "entropy")])]),
        plot_lines(runs, out, "clip_ratio.png", "Clipped importance ratios", "Fraction of tokens whose ratio was "
                   "clipped.", [("fraction", clip)]),
        plot_lines(runs, out, "optimizer.png", "Learning rate and gradient norm",
                   "Scheduled learning rate, and the global gradient norm before clipping.",
                   [("learning rate", [("learning_rate", "learning rate")]), ("grad norm", [("grad_norm", "grad norm")])]),
        plot_lines(runs, out, "throughput.png", "Generation throughput", "Completion tokens generated per second.",
                   [("tokens / s", [("gen/tokens_per_s", "tokens/s")])]),
        plot_lines(runs, out, "time.png", "Time per step", "Wall time of the whole step and of generation in it.",
                   [("seconds", [("time/step_s", "step"), ("time/generate_s", "generation")])]),
        plot_lines(runs, out, "memory.png", "Peak memory", "Peak GPU memory allocated (CUDA) or peak RSS (CPU).",
                   [("MiB", [("memory/peak_mib", "peak memory")])]),
    ]
    return [p for p in plots if p is not None]
