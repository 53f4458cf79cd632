"""W-long reporting for vs_trl.py: per length and trainer, trained or not, peak RSS, slimgrpo's plan,
s/step; the longest length each trains; a PNG of peak memory against length. Run alone, it merges the
``--out`` files of separate sweeps (one per trainer, say) into one table and plot:

    python -m benchmarks.speed.w_long .bench/w_long_trl.json .bench/w_long_slim.json --png docs/img/w_long.png

A run "trained" when it finished its steps (a warm-up and one timed step). Otherwise it "did not fit"
(killed by the memory cap, or an out-of-memory error) or was "too slow" (its time limit ran out: it is
not a memory verdict), or "failed" for any other error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.tables import MIB, format_mib


def status(r) -> str:
    if r.ok and len(r.steps) >= 2:
        return "trained"
    if r.outcome.killed_by_cap:
        return "did not fit"
    if r.outcome.error.startswith("timed out"):
        return "too slow"
    return "failed"


def plan_mib(s, L: int) -> float | None:
    """slimgrpo's plan (peak, MiB) for the W-long run at completion length ``L``."""
    try:
        from benchmarks.surface import ModelShape, RunSpec, auto_token_chunk, plan_memory
    except ImportError:
        return None
    sh = s.shape
    shape = ModelShape(family=sh["family"], hidden=sh["hidden"], intermediate=sh["intermediate"], layers=sh["layers"],
                       heads=sh["heads"], kv_heads=sh["kv_heads"], vocab=sh["vocab"], tie=sh["tie"],
                       max_positions=sh.get("max_positions", 0))
    rows = s.prompts_per_step * s.num_generations
    x = RunSpec(device="cpu" if s.device == "cpu" else "cuda", param_dtype_bytes=4 if s.dtype == "float32" else 2,
                lora=s.lora, lora_rank=s.lora_r, num_generations=s.num_generations,
                prompts_per_step=s.prompts_per_step, micro_batch_rows=rows, max_prompt_length=s.max_prompt_length,
                max_completion_length=L, beta=s.beta, gradient_checkpointing=s.gradient_checkpointing,
                padding_mask=s.prompts_per_step > 1,
                token_chunk=auto_token_chunk(sh["vocab"]))  # what the run uses: loss.token_chunk=None = auto
    return plan_memory(shape, x).peak_bytes / MIB


def table(results: list, trainers: list[str], s, cap) -> tuple[str, dict[str, Any]]:
    lengths = sorted({r.completion_length for r in results})
    head = "| completion | " + " | ".join(
        f"{t}: result | peak RSS MiB{' | plan MiB' if t == 'slimgrpo' else ''} | s/step" for t in trainers) + " |"
    ncols = sum(4 if t == "slimgrpo" else 3 for t in trainers)
    lines = [head, "|---:|" + "---|" * ncols]
    rows = []
    for L in lengths:
        cells = []
        for t in trainers:
            r = next((r for r in results if r.trainer == t and r.completion_length == L), None)
            plan = plan_mib(s, L) if t == "slimgrpo" else None
            if r is None:
                cells += ["not run", "-"] + (["-" if plan is None else f"{plan:,.0f}"] if t == "slimgrpo" else []) + ["-"]
                continue
            st = status(r)
            rows.append({"trainer": t, "completion_length": L, "result": st,
                         "peak_rss_mib": r.outcome.peak_rss_mib, "plan_mib": plan, "s_per_step": r.s_per_step(),
                         "error": r.outcome.error})
            result = st if st == "trained" else f"{st} ({r.outcome.error})"
            cells += [result, format_mib(r.outcome.peak_rss_mib)]
            if t == "slimgrpo":
                cells.append("-" if plan is None else f"{plan:,.0f}")
            cells.append("-" if r.s_per_step() is None or st != "trained" else f"{r.s_per_step():.1f}")
        lines.append(f"| {L:,} | " + " | ".join(cells) + " |")
    longest = {t: max((x["completion_length"] for x in rows if x["trainer"] == t and x["result"] == "trained"),
                      default=None) for t in trainers}
    lines.append("")
    lines.append(f"Longest completion trained under {cap.describe()}: "
                 + ", ".join(f"{t} {longest[t]:,}" if longest[t] else f"{t} none" for t in trainers))
    if longest.get("trl") and longest.get("slimgrpo"):
        lines.append(f"slimgrpo / TRL longest completion: {longest['slimgrpo'] / longest['trl']:.0f}x")
    return "\n".join(lines), {"longest_completion": longest, "rows": rows}


def plot(summary: dict[str, Any], cap_bytes: int | None, path: Path, title: str) -> Path | None:
    """Peak RSS against completion length for each trainer; failed lengths marked with their reason."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"trl": ("tab:red", "o"), "slimgrpo": ("tab:blue", "s")}
    for t in sorted({x["trainer"] for x in summary["rows"]}):
        pts = [x for x in summary["rows"] if x["trainer"] == t and x["peak_rss_mib"]]
        color, marker = styles.get(t, ("tab:gray", "^"))
        ok = [x for x in pts if x["result"] == "trained"]
        ax.plot([x["completion_length"] for x in ok], [x["peak_rss_mib"] / 1024 for x in ok], marker=marker,
                color=color, label=f"{t} (trained)")
        for x in pts:
            if x["result"] != "trained":
                ax.scatter([x["completion_length"]], [x["peak_rss_mib"] / 1024], marker="x", color=color, s=60)
                ax.annotate(x["result"], (x["completion_length"], x["peak_rss_mib"] / 1024), fontsize=7,
                            xytext=(4, -10), textcoords="offset points", color=color)
        plans = [x for x in pts if x.get("plan_mib")]
        if plans:
            ax.plot([x["completion_length"] for x in plans], [x["plan_mib"] / 1024 for x in plans], ls="--",
                    color=color, alpha=0.6, label=f"{t} plan")
    if cap_bytes:
        ax.axhline(cap_bytes / 2**30, color="black", ls=":", label=f"cap {cap_bytes / 2**30:.0f} GiB")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("peak RSS (GiB)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def merge(paths: list[str], png: Path | None) -> str:
    """One table (and plot) from the ``--out`` files of separate sweeps, e.g. one per trainer: the rows
    as measured, the longest length each trained and their ratio."""
    import json

    rows, caps, machines = [], set(), []
    for p in paths:
        data = json.loads(Path(p).read_text())
        rows += data["summary"]["rows"]
        caps.add(data.get("memory_cap", "?"))
        machines.append(f"{p}: load {data.get('machine', {}).get('load_avg_1m', '?')} at the start")
    trainers = [t for t in ("trl", "slimgrpo") if any(r["trainer"] == t for r in rows)]
    lines = ["| completion tokens | trainer | result | peak RSS MiB | plan MiB | s/step |", "|---:|---|---|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["completion_length"], trainers.index(r["trainer"]))):
        plan = "-" if not r.get("plan_mib") else f"{r['plan_mib']:,.0f}"
        step = "-" if r["result"] != "trained" or r["s_per_step"] is None else f"{r['s_per_step']:.1f}"
        result = r["result"] if r["result"] == "trained" else f"{r['result']} ({r['error']})"
        lines.append(f"| {r['completion_length']:,} | {r['trainer']} | {result} | "
                     f"{format_mib(r['peak_rss_mib'])} | {plan} | {step} |")
    longest = {t: max((r["completion_length"] for r in rows if r["trainer"] == t and r["result"] == "trained"),
                      default=None) for t in trainers}
    lines += ["", "Longest completion trained: " + ", ".join(f"{t} {longest[t] or 0:,}" for t in trainers),
              f"Memory cap: {' / '.join(sorted(caps))}", *machines]
    if longest.get("trl") and longest.get("slimgrpo"):
        lines.append(f"slimgrpo / TRL longest completion: {longest['slimgrpo'] / longest['trl']:g}x")
    if png is not None:
        cap = 8 * 2**30 if any("8.0 GiB" in c for c in caps) else None
        plot({"rows": rows}, cap, png, "W-long: peak RSS against completion length (" + ", ".join(trainers) + ")")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Merge W-long --out files (one per trainer) into one table and plot.")
    ap.add_argument("json", nargs="+")
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    print(merge(args.json, args.png))
