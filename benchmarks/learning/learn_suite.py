"""The learning suite: four small tasks on SmolLM2-135M-Instruct, slimgrpo against TRL 1.16, held-out gains.

Each trainer runs with its own defaults wherever a task's recipe is silent; both are scored on held-out
questions by the same evaluator.

    python -m benchmarks.learning.learn_suite --seeds 0 1 2 --png docs/img/learn_suite.png
    python -m benchmarks.learning.learn_suite --tasks sort extract --seeds 0 --trainers slimgrpo   # a part of it

A task is a recipe under examples/ (``smollm2_<task>.yaml`` beside ``smollm2_<task>.py``: its data maker with a
fixed train / held-out split, and its rewards in TRL's contract); ``--tasks`` also takes a path to such a YAML.
Per task: the base model is scored once; then per seed and trainer, ``slimgrpo train RECIPE`` (the CLI: the
recipe's settings, slimgrpo's defaults for the rest) or TRL's GRPOTrainer through its child (the recipe's
keys under their GRPOConfig names and nothing else, so GRPOConfig's defaults for the rest: adam_beta2 0.999,
a linear schedule, ...; the rule and its table: runs.trl_own_defaults), and the trained model is scored by
``slimgrpo eval`` (``--eval-samples`` samples per held-out prompt at the recipe's temperature, and greedy).
Wall time is the whole process from outside (start-up, loading and saving included), peak RSS from outside
(harness/measure.py). A run is **collapsed** when its held-out accuracy, sampled or greedy, ends more than 10
points below the base model's.

Results are kept in OUT/results.json as each part (a task's base score, one trainer x seed: train + score)
finishes, and a part already there is not run again: a campaign can be run a task or a seed at a time with
the same ``--out``, one at a time (a second suite on a folder another is writing stops, naming it). Each task's
data, logs and models are under OUT/<task>/.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness.machine import load_line, machine_info
from benchmarks.harness.paths import BENCH_DIR, REPO_ROOT
from benchmarks.harness.tables import format_mib, save_plot
from benchmarks.learning import runs

EXAMPLES = REPO_ROOT / "examples"
TASKS = ("addition", "word_problems", "extract", "sort")
TRAINERS = ("slimgrpo", "trl")
LABELS = {"slimgrpo": "slimgrpo", "trl": "TRL 1.16"}
COLLAPSE_POINTS = 0.10  # held-out accuracy this far below the base model's = collapsed


def recipe_path(task: str) -> Path:
    """``addition`` -> examples/smollm2_addition.yaml; a path to a YAML is taken as it is."""
    path = Path(task)
    if path.suffix in (".yaml", ".yml"):
        return path.resolve()
    path = EXAMPLES / f"smollm2_{task}.yaml"
    if not path.is_file():
        raise SystemExit(f"unknown task {task!r}: known {', '.join(TASKS)}, or a recipe YAML beside its .py")
    return path


def task_name(task: str) -> str:
    return Path(task).stem.removeprefix("smollm2_") if task.endswith((".yaml", ".yml")) else task


def recipe_model(recipe: Path) -> Path:
    """The recipe's own model.path (relative to its folder, as slimgrpo reads it)."""
    from benchmarks.surface import load_config

    return Path(load_config(recipe, validate=False).model.path)


def collapsed(run_eval: dict, base: dict) -> bool:
    return any(run_eval[f"{m}_accuracy"] < base[f"{m}_accuracy"] - COLLAPSE_POINTS for m in ("sampled", "greedy"))


def run_task(task: str, a, results: dict, save) -> None:
    recipe = recipe_path(task)
    name = task_name(task)
    out = a.out / name
    out.mkdir(parents=True, exist_ok=True)
    r = runs.load_recipe(recipe)
    steps = a.steps or r["run"]["max_steps"]
    model = a.model.resolve() if a.model else recipe_model(recipe)
    keep_best = bool(r.get("run", {}).get("keep_best")) and not a.no_keep_best  # the recipe's, unless told off
    settings = {"recipe": str(recipe), "model": str(model), "steps": steps, "eval_samples": a.eval_samples,
                "eval_limit": a.eval_limit}
    if keep_best:  # (a campaign from before keep_best has no such key: it stays comparable with --no-keep-best)
        settings["keep_best"] = True
        metric = r["run"].get("best_metric")
        if metric:  # the judge (a campaign judged by the default, before recipes named theirs, has no such key)
            settings["best_metric"] = metric
    entry = results.setdefault(name, {"settings": settings})
    if entry["settings"] != settings:  # a resumed campaign must not mix runs of different settings
        raise SystemExit(f"{name}: {a.out / 'results.json'} holds runs with {entry['settings']}, not {settings}; "
                         "use another --out or the same settings")
    train, heldout = runs.make_data(recipe.with_suffix(".py"), out / "data")

    def score(model_dir: Path, stem: str) -> dict:
        return runs.evaluate(recipe, model_dir, heldout, out / stem, a.num_threads, a.eval_samples, a.eval_limit)

    if "base" not in entry:
        entry["base"] = score(model, "eval-base")
        save()
    base = entry["base"]
    print(f"{name}: base sampled {base['sampled_accuracy']:.1%} greedy {base['greedy_accuracy']:.1%}", flush=True)
    for seed, trainer, key in runs.pending_runs(entry, a.seeds, a.trainers):
        t = time.perf_counter()
        if trainer == "slimgrpo":
            run = runs.train_slimgrpo(recipe, seed, model, steps, a.num_threads, train, out / key,
                                      out / f"{key}.log", keep_best=keep_best)
        else:
            spec = runs.trl_spec(recipe, r, model, train, seed, steps, a.num_threads, out / key)
            run = runs.run_trl(spec, out / f"{key}.spec.json", out / f"{key}.log", seed)
            run["trl_config"] = spec["grpo_config"]
        run["eval"] = score(Path(run["model"]), f"eval-{key}")
        if trainer == "slimgrpo":
            runs.drop_checkpoints(out / key)
        run["collapsed"] = collapsed(run["eval"], base)
        run["load_after"] = os.getloadavg()[0]
        entry[key] = run
        save()
        print(f"{name} {key}: wall {run['wall_s']:.0f} s, peak {run['peak_rss_mib']:,.0f} MiB, held-out sampled "
              f"{run['eval']['sampled_accuracy']:.1%} greedy {run['eval']['greedy_accuracy']:.1%}"
              f"{' COLLAPSED' if run['collapsed'] else ''}{best_text(run)} ({time.perf_counter() - t:.0f} s with eval)",
              flush=True)
    if a.score_last:
        score_last_models(entry, steps, out, score, save)


def score_last_models(entry: dict, steps: int, out: Path, score, save) -> None:
    """``--score-last``: each keep_best run's last-step model (``last/``) scored like its ``final/``, so the table
    can set the model keep_best returned beside the one a run without it would have returned (same training
    run). A run whose best was its last step scored that model already."""
    for key, run in entry.items():
        if not key.startswith("slimgrpo-s") or "eval" not in run or "eval_last" in run or run.get("final_step") is None:
            continue
        if run["final_step"] == steps:
            run["eval_last"] = run["eval"]
        elif (out / key / "last").is_dir():
            run["eval_last"] = score(out / key / "last", f"eval-{key}-last")
        else:
            continue
        save()


def best_text(run: dict) -> str:
    """``; kept step 20 of 40 (val greedy 59.4%)`` for a run.keep_best run, else ''."""
    if run.get("final_step") is None:
        return ""
    shown = value_text(run.get("best_metric"), run.get("best_value")) or "?"
    return f"; kept step {run['final_step']} ({run.get('best_metric')} {shown} on the validation prompts)"


def value_text(metric: str | None, value) -> str:
    """A judgement's value as the metric reads: a share (``eval/accuracy_*``, ``eval/pass@k``) in percent, a
    reward as the number it is; '' when there is none."""
    if not isinstance(value, (int, float)):
        return ""
    share = metric is None or metric.startswith(("eval/accuracy", "eval/pass@"))
    return f"{value:.1%}" if share else f"{value:.3f}"


def _runs(entry: dict, trainer: str) -> list[tuple[int, dict]]:
    rows = [(int(k.split("-s")[1]), v) for k, v in entry.items() if k.startswith(f"{trainer}-s") and "eval" in v]
    return sorted(rows, key=lambda row: row[0])


def _gains(entry: dict, trainer: str, measure: str = "sampled") -> list[float]:
    base = entry["base"][f"{measure}_accuracy"]
    return [v["eval"][f"{measure}_accuracy"] - base for _, v in _runs(entry, trainer)]


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:  # no spread to state from one seed
        return f"{100 * values[0]:+.1f} (1)"
    return f"{100 * statistics.mean(values):+.1f} ± {100 * statistics.stdev(values):.1f} ({len(values)})"


def summary(results: dict) -> list[str]:
    """Per task: the base model, each trainer's mean gain ± sd over seeds, collapses and the wall-time ratio;
    then one row per task, trainer and seed."""
    lines = ["| task | base sampled / greedy | TRL 1.16 gain ± sd (seeds) | slimgrpo gain ± sd (seeds) | "
             "collapsed TRL / slimgrpo | wall s TRL / slimgrpo | wall ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, entry in results.items():
        if "base" not in entry:
            continue
        b = entry["base"]
        walls = {t: [v["wall_s"] for _, v in _runs(entry, t)] for t in TRAINERS}
        falls = {t: sum(v["collapsed"] for _, v in _runs(entry, t)) for t in TRAINERS}
        mean = {t: statistics.mean(w) if w else None for t, w in walls.items()}
        ratio = f"{mean['slimgrpo'] / mean['trl']:.2f}x" if mean["slimgrpo"] and mean["trl"] else "-"
        wall = " / ".join("-" if mean[t] is None else f"{mean[t]:.0f}" for t in ("trl", "slimgrpo"))
        lines.append(f"| {name} | {b['sampled_accuracy']:.1%} / {b['greedy_accuracy']:.1%} | "
                     f"{_mean_sd(_gains(entry, 'trl'))} | {_mean_sd(_gains(entry, 'slimgrpo'))} | "
                     f"{falls['trl']} / {falls['slimgrpo']} | {wall} | {ratio} |")
    lines += ["", "(gains: held-out accuracy after minus before, sampled, in points; ± is the sd over seeds; "
                  f"collapsed: held-out accuracy, sampled or greedy, more than {100 * COLLAPSE_POINTS:.0f} points "
                  "below the base model's; wall ratio: slimgrpo / TRL, mean wall time per run)", "",
              "| task | trainer | seed | wall s | peak RSS MiB | held-out sampled | gain | greedy | gain | collapsed | "
              "best step (value) | last step's model: sampled / greedy gain |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for name, entry in results.items():
        if "base" not in entry:
            continue
        b = entry["base"]
        for trainer in TRAINERS:
            for seed, v in _runs(entry, trainer):
                s, g = v["eval"]["sampled_accuracy"], v["eval"]["greedy_accuracy"]
                lines.append(f"| {name} | {LABELS[trainer]} | {seed} | {v['wall_s']:.0f} | "
                             f"{format_mib(v['peak_rss_mib'])} | {s:.1%} | {100 * (s - b['sampled_accuracy']):+.1f} | "
                             f"{g:.1%} | {100 * (g - b['greedy_accuracy']):+.1f} | {'yes' if v['collapsed'] else ''} | "
                             f"{best_cell(v)} | {last_cell(v, b)} |")
    return lines


def best_cell(run: dict) -> str:
    """The table's ``best step (value)``: the step whose model was scored and its validation value (run.keep_best;
    ``-`` for a run that kept its last step by design, TRL's and campaigns without keep_best)."""
    if run.get("final_step") is None:
        return "-"
    shown = value_text(run.get("best_metric"), run.get("best_value"))
    return f"{run['final_step']} ({shown})" if shown else str(run["final_step"])


def last_cell(run: dict, base: dict) -> str:
    """``+58.0 / +36.0``: the last-step model's held-out gains (``--score-last``), ``-`` where not scored."""
    e = run.get("eval_last")
    if e is None:
        return "-"
    return " / ".join(f"{100 * (e[f'{m}_accuracy'] - base[f'{m}_accuracy']):+.1f}" for m in ("sampled", "greedy"))


def plot(results: dict, png: Path) -> None:
    """Mean held-out gain per task and trainer (bars, sd as error bars), each seed a dot, collapsed seeds a cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, e in results.items() if "base" in e]
    colors = {"trl": "tab:orange", "slimgrpo": "tab:blue"}
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(names)), 4))
    width = 0.38
    for j, trainer in enumerate(("trl", "slimgrpo")):
        for i, name in enumerate(names):
            gains = [100 * g for g in _gains(results[name], trainer)]
            if not gains:
                continue
            x = i + (j - 0.5) * width
            sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
            ax.bar(x, statistics.mean(gains), width, yerr=sd, color=colors[trainer], alpha=0.7, capsize=3,
                   label=LABELS[trainer] if i == 0 else None)
            for (_, v), gain in zip(_runs(results[name], trainer), gains):
                ax.scatter([x], [gain], color="black", marker="x" if v["collapsed"] else "o", s=18, zorder=3)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{n}\n(base {results[n]['base']['sampled_accuracy']:.0%})" for n in names])
    ax.set_ylabel("held-out accuracy gain, sampled (points)")
    ax.set_title("SmolLM2-135M-Instruct, each trainer's defaults where the recipe is silent\n"
                 "bars: mean over seeds, ± sd; dots: seeds; x: collapsed")
    ax.legend(fontsize=8)
    save_plot(fig, png)


def claim_campaign(out: Path):
    """One writer per campaign folder: a second suite on the same ``--out`` would overwrite the first's
    results.json with its own view of it (each keeps the file in memory between parts). Returns the open lock
    file (released when it is closed, or with the process); refuses, naming the folder, while another holds it."""
    lock = open(out / ".learn_suite.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(f"{out}: another learn_suite.py is writing this campaign (results.json); wait for it "
                         "to finish, or give this one another --out") from None
    return lock


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=list(TASKS),
                   help=f"task names ({', '.join(TASKS)}) or recipe YAMLs beside their .py (default: all four)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="default: each recipe's run.max_steps")
    p.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    p.add_argument("--model", type=Path, default=None, help="model folder (default: each recipe's model.path)")
    p.add_argument("--num-threads", type=int, default=os.cpu_count())
    p.add_argument("--eval-samples", type=int, default=4, help="sampled completions per held-out prompt")
    p.add_argument("--eval-limit", type=int, default=None, help="score only the first N held-out prompts")
    p.add_argument("--no-keep-best", action="store_true",
                   help="slimgrpo's runs return their last step's model (the suite before issue 46), even where the "
                        "recipe says run.keep_best; with it, they are judged on the last 32 training prompts")
    p.add_argument("--score-last", action="store_true",
                   help="also score each keep_best run's last-step model (last/), for the column beside final/'s")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "runs" / "learn_suite", help="campaign folder")
    p.add_argument("--png", type=Path, default=None, help="write the plot here")
    a = p.parse_args(argv)
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    lock = claim_campaign(a.out)
    results_path = a.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}

    def save() -> None:
        tmp = results_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(results_path)

    print(f"{load_line('start')}; {machine_info().get('cpu', '')}; "
          f"threads {a.num_threads}; tasks {' '.join(a.tasks)}; seeds {a.seeds}; trainers {' '.join(a.trainers)}",
          flush=True)
    for task in a.tasks:
        run_task(task, a, results, save)
    table = summary(results)
    print("\n".join(table))
    (a.out / "summary.md").write_text("\n".join(table) + "\n")
    lock.close()
    if a.png:
        plot(results, a.png)
    print(load_line("end"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
