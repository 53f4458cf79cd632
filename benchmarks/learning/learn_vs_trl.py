"""Learning on a real model, slimgrpo against TRL 1.16: the recipe examples/smollm2_addition.yaml, same
settings and seeds in both trainers, held-out accuracy before and after, reward curves in one plot.

    python -m benchmarks.learning.learn_vs_trl --model .bench/smollm2 --seeds 0 1 2 [--steps 40] \
        [--png docs/img/learn_smollm2.png]

Per seed: ``slimgrpo train`` (the CLI, as a user runs the recipe), then TRL's GRPOTrainer through its child
(children/trl_grpo.py) with the recipe's settings (learning rate, AdamW betas, loss type, beta, group size,
batch, completion length, temperature, reward functions and weights, shuffled prompts, full fine-tuning,
float32, no gradient checkpointing). Both trained models are then scored by the same evaluator
(``slimgrpo eval``: 4 sampled completions per held-out prompt at the recipe's temperature, plus greedy) on the
100 held-out questions that neither trainer sees. Wall time is measured from outside, model loading
included; peak RSS from outside (harness/measure.py).

Results are kept in RUN_DIR/results.json as each part finishes, and a part already there is not run again,
so a campaign can be run seed by seed (``--seeds 0`` now, ``--seeds 1 2`` later, same ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness.machine import load_line, machine_info
from benchmarks.harness.paths import BENCH_DIR, REPO_ROOT
from benchmarks.harness.tables import save_plot
from benchmarks.learning import runs

RECIPE = REPO_ROOT / "examples" / "smollm2_addition.yaml"
RECIPE_CODE = REPO_ROOT / "examples" / "smollm2_addition.py"
EVAL_SEED = runs.EVAL_SEED
accuracy_of = runs.accuracy_of
slimgrpo_cmd = runs.slimgrpo_cmd


def recipe() -> dict:
    return runs.load_recipe(RECIPE)


def make_data(out: Path) -> tuple[Path, Path]:
    """The recipe's fixed train / held-out files in ``out/data`` (by the recipe's own data maker)."""
    return runs.make_data(RECIPE_CODE, out / "data")


def evaluate(model: Path, heldout: Path, out: Path, threads: int) -> dict:
    """Held-out accuracy of ``model``: 4 samples per prompt at the recipe's temperature, and greedy."""
    return runs.evaluate(RECIPE, model, heldout, out, threads, samples=4)


def train_slimgrpo(seed: int, a, train: Path, out: Path) -> dict:
    return runs.train_slimgrpo(RECIPE, seed, a.model, a.steps, a.num_threads, train, out / f"slimgrpo-s{seed}",
                               out / f"slimgrpo-s{seed}.log")


def train_trl(seed: int, a, train: Path, out: Path) -> dict:
    """TRL with the recipe's settings and slimgrpo's values for the rest (the matched spec of the TRL child)."""
    r = recipe()
    spec = {
        "model_path": str(a.model), "prompts_path": str(train), "rewards": runs.reward_specs(RECIPE, r),
        "reward_weights": r["rewards"]["reward_weights"], "shuffle": r["data"]["shuffle"],
        "prompts_per_step": r["run"]["batch_size"] // r["rollout"]["num_generations"],
        "num_generations": r["rollout"]["num_generations"],
        "completion_length": r["rollout"]["max_completion_length"], "pin_length": False,
        "temperature": r["rollout"]["temperature"], "top_p": 1.0, "top_k": 0,
        "beta": r["loss"]["beta"], "epsilon": 0.2, "loss_type": r["loss"]["loss_type"],
        "learning_rate": r["optim"]["learning_rate"], "steps": a.steps, "seed": seed,
        "gradient_checkpointing": r["memory"]["gradient_checkpointing"], "dtype": r["model"]["dtype"],
        "device": "cpu", "num_threads": a.num_threads, "output_dir": str(out / f"trl-s{seed}"),
        "save_dir": str(out / f"trl-s{seed}" / "final"),
    }
    return runs.run_trl(spec, out / f"trl-s{seed}.spec.json", out / f"trl-s{seed}.log", seed)


def summary(results: dict) -> list[str]:
    base = results["base"]
    lines = [f"held-out before training: sampled {base['sampled_accuracy']:.1%}, greedy {base['greedy_accuracy']:.1%}",
             "", "| trainer | seed | wall s | s/step | peak RSS MiB | held-out sampled | gain | greedy | gain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    means = {}
    for trainer in ("slimgrpo", "trl"):
        rows = [(int(k.split("-s")[1]), v) for k, v in sorted(results.items()) if k.startswith(f"{trainer}-s")]
        rows = [(seed, v) for seed, v in rows if "eval" in v]
        for seed, v in rows:
            s, g = v["eval"]["sampled_accuracy"], v["eval"]["greedy_accuracy"]
            lines.append(f"| {trainer} | {seed} | {v['wall_s']:.0f} | {v['wall_s'] / len(v['curve']):.1f} | "
                         f"{v['peak_rss_mib']:,.0f} | {s:.1%} | {s - base['sampled_accuracy']:+.1%} | {g:.1%} | "
                         f"{g - base['greedy_accuracy']:+.1%} |")
        if rows:
            gains = [v["eval"]["sampled_accuracy"] - base["sampled_accuracy"] for _, v in rows]
            greedy = [v["eval"]["greedy_accuracy"] - base["greedy_accuracy"] for _, v in rows]
            walls = [v["wall_s"] for _, v in rows]
            means[trainer] = (statistics.mean(gains), statistics.mean(walls))
            sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
            lines.append(f"| **{trainer} mean** | {len(rows)} seeds | {statistics.mean(walls):.0f} | | | | "
                         f"**{statistics.mean(gains):+.1%}** ± {sd:.1%} | | {statistics.mean(greedy):+.1%} |")
    if len(means) == 2:
        lines += ["", f"wall time slimgrpo / TRL: {means['slimgrpo'][1] / means['trl'][1]:.2f}x; "
                      f"mean sampled gain slimgrpo {means['slimgrpo'][0]:+.1%} vs TRL {means['trl'][0]:+.1%}"]
    return lines


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"slimgrpo": "tab:blue", "trl": "tab:orange"}
    for key, v in sorted(results.items()):
        if "-s" not in key or "curve" not in v:
            continue
        trainer = key.split("-s")[0]
        xs = [c["step"] for c in v["curve"]]
        ys = [c["reward"] for c in v["curve"]]
        left.plot(xs, ys, color=colors[trainer], alpha=0.25, lw=1)
    for trainer, color in colors.items():
        curves = [v["curve"] for k, v in results.items() if k.startswith(f"{trainer}-s") and "curve" in v]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        mean = [statistics.mean(c[i]["reward"] for c in curves) for i in range(n)]
        window = 5
        smooth = [statistics.mean(mean[max(0, i - window + 1): i + 1]) for i in range(n)]
        label = "TRL 1.16" if trainer == "trl" else "slimgrpo"
        left.plot([curves[0][i]["step"] for i in range(n)], smooth, color=color, lw=2.5,
                  label=f"{label} (mean of {len(curves)} seeds, 5-step average)")
    left.set_xlabel("step")
    left.set_ylabel("training reward (accuracy + 0.5 x only-the-number)")
    left.legend(fontsize=8)
    left.set_title("reward per step")
    base = results["base"]
    labels, values, colors_bar = ["base"], [base["sampled_accuracy"]], ["grey"]
    dots = [[]]
    for trainer, color in colors.items():
        accs = [v["eval"]["sampled_accuracy"] for k, v in sorted(results.items())
                if k.startswith(f"{trainer}-s") and "eval" in v]
        if accs:
            labels.append("TRL 1.16" if trainer == "trl" else "slimgrpo")
            values.append(statistics.mean(accs))
            colors_bar.append(color)
            dots.append(accs)
    right.bar(labels, values, color=colors_bar, alpha=0.7)
    for i, accs in enumerate(dots):
        right.scatter([i] * len(accs), accs, color="black", s=12, zorder=3)
    right.set_ylabel("held-out accuracy (100 questions x 4 samples)")
    right.set_title("held-out accuracy, before and after (dots: seeds)")
    fig.suptitle("SmolLM2-135M-Instruct, examples/smollm2_addition.yaml, CPU")
    save_plot(fig, png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=BENCH_DIR / "smollm2", help="SmolLM2 folder (get_smollm2.py)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="default: the recipe's run.max_steps")
    p.add_argument("--num-threads", type=int, default=os.cpu_count())
    p.add_argument("--trainers", nargs="+", default=["slimgrpo", "trl"], choices=["slimgrpo", "trl"])
    p.add_argument("--out", type=Path, default=BENCH_DIR / "runs" / "learn", help="campaign folder")
    p.add_argument("--png", type=Path, default=None, help="write the plot here")
    a = p.parse_args(argv)
    a.steps = a.steps or recipe()["run"]["max_steps"]
    a.model = a.model.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    results_path = a.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}

    def save() -> None:
        results_path.write_text(json.dumps(results, indent=1))

    print(f"{load_line('start')}; {machine_info().get('cpu', '')}; threads {a.num_threads}; steps {a.steps}",
          flush=True)
    train, heldout = make_data(a.out)
    if "base" not in results:
        results["base"] = evaluate(a.model, heldout, a.out / "eval-base", a.num_threads)
        save()
    print(f"base: sampled {results['base']['sampled_accuracy']:.1%}  greedy {results['base']['greedy_accuracy']:.1%}",
          flush=True)
    for seed, trainer, key in runs.pending_runs(results, a.seeds, a.trainers):
        t = time.perf_counter()
        fn = train_slimgrpo if trainer == "slimgrpo" else train_trl
        results[key] = fn(seed, a, train, a.out)
        results[key]["eval"] = evaluate(Path(results[key]["model"]), heldout, a.out / f"eval-{key}", a.num_threads)
        results[key]["load_after"] = os.getloadavg()[0]
        save()
        v = results[key]
        print(f"{key}: wall {v['wall_s']:.0f} s, peak {v['peak_rss_mib']:,.0f} MiB, held-out sampled "
              f"{v['eval']['sampled_accuracy']:.1%} greedy {v['eval']['greedy_accuracy']:.1%} "
              f"({time.perf_counter() - t:.0f} s with eval)", flush=True)
    print("\n".join(summary(results)))
    if a.png:
        plot(results, a.png)
    print(load_line("end"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
