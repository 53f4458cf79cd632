"""The same run through a TRL script with its import changed and through ``slimgrpo train --trl-config``: step
time and peak memory side by side (issue 55's goal: within 3%).

    python -m benchmarks.speed.script_vs_cli [--model .bench/smollm2] [--steps 5] [--repeats 2] [--length 64]

One set of GRPOConfig settings (SmolLM2-135M-Instruct by default, GSM8K chat prompts, 8 completions of at most
``--length`` tokens a step, beta 0.04, a constant schedule, fp32 on CPU, seed 0) is given twice: as keywords to
``slimgrpo.trl.GRPOConfig`` in a script (``benchmarks.children.trl_script``, which imports the data library
before the trainer, as scripts do) and as the YAML of ``trl grpo`` to ``python -m slimgrpo train --trl-config``.
Both are one slimgrpo run with the same seed, so they do the same work (the test suite checks their metrics are
equal bit for bit); what may differ is what each process does around the steps. Each run is a process of its
own under the memory-measuring intermediate (peak RSS from outside); the two alternate, ``--repeats`` times.
A step's time is the run's own ``time/step_s`` (metrics.jsonl); the first step (warm-up) is left out of the
median. Run it on a quiet machine: it prints the load before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import processes
from benchmarks.harness.builders import write_chat_prompts
from benchmarks.harness.machine import load_line, machine_info, machine_line
from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap, parse_size
from benchmarks.harness.paths import BENCH_DIR
from benchmarks.harness.tables import format_mib, markdown_table

REWARD = '''
import re


def tagged_number(completions, answer, **kwargs):
    """1 for the gold number between <answer> tags, a little for the tags alone."""
    out = []
    for c, a in zip(completions, answer):
        text = c[0]["content"] if isinstance(c, list) else c
        found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
        out.append(1.0 if found and found[-1].strip() == a else (0.1 if found else 0.0))
    return out
'''


def settings(a, output_dir: Path) -> dict:
    return {"output_dir": str(output_dir), "per_device_train_batch_size": 8, "num_generations": 8,
            "max_completion_length": a.length, "max_steps": a.steps, "learning_rate": 1e-6, "beta": 0.04,
            "lr_scheduler_type": "constant", "logging_steps": 1, "save_steps": 1000, "seed": 0, "bf16": False,
            "report_to": "none"}


def step_times(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["time/step_s"] for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(BENCH_DIR / "smollm2"), help="a model folder (scripts/get_smollm2.py)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--length", type=int, default=64, help="max_completion_length")
    p.add_argument("--cap", default="12GiB", help="memory cap per run")
    a = p.parse_args()
    if not (Path(a.model) / "config.json").is_file():
        sys.exit(f"{a.model} holds no model: python scripts/get_smollm2.py {a.model}")
    a.model = str(Path(a.model).resolve())  # the YAML's relative paths are read from its own folder
    root = BENCH_DIR / "script_vs_cli" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True)
    (root / "sv_reward.py").write_text(REWARD)
    prompts = write_chat_prompts(root / "prompts.jsonl", 8 * a.steps)
    cap = choose_memory_cap(parse_size(a.cap))
    env = processes.child_env(root, OMP_NUM_THREADS="2")  # the reward module's folder first
    print(machine_line(machine_info()))
    print(load_line("start"), flush=True)
    rows = []
    for r in range(a.repeats):
        for way in ("script", "cli"):
            out = root / f"{way}-{r}"
            out.mkdir()
            given = settings(a, out / "run")
            if way == "script":
                spec = {"settings": given, "model": a.model, "prompts": str(prompts), "reward": "sv_reward:tagged_number"}
                (out / "spec.json").write_text(json.dumps(spec))
                cmd = processes.child_command("trl_script", out / "spec.json")
            else:
                yaml = {**given, "model_name_or_path": a.model, "dataset_name": str(prompts),
                        "reward_funcs": ["sv_reward.tagged_number"]}
                (out / "grpo.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in yaml.items()))
                cmd = processes.module_command("slimgrpo", "train", "--trl-config", out / "grpo.yaml")
            res = run_measured(cmd, out / "log.txt", cap, f"script-vs-cli-{way}-{r}", env=env, timeout_s=3600)
            times = step_times(out / "run") if res.returncode == 0 else []
            row = {"way": way, "repeat": r, "ok": res.returncode == 0, "wall_s": res.wall_s,
                   "peak_rss_mib": res.peak_rss_mib, "step_s": times,
                   "median_step_s": statistics.median(times[1:] or times) if times else None, "error": res.error}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(load_line("end"))
    (root / "results.json").write_text(json.dumps(rows, indent=2))
    table = []
    for way in ("script", "cli"):
        mine = [r for r in rows if r["way"] == way and r["ok"]]
        steps = [t for r in mine for t in r["step_s"][1:]]
        table.append([way, str(len(mine)), f"{statistics.median(steps):.2f}" if steps else "-",
                      f"{statistics.median([r['wall_s'] for r in mine]):.1f}" if mine else "-",
                      format_mib(max((r["peak_rss_mib"] or 0 for r in mine), default=None))])
    script, cli = (float(t[2]) if t[2] != "-" else None for t in table)
    print()
    print("\n".join(markdown_table(["way", "runs", "median s/step (steps 2+)", "median wall s", "peak RSS MiB"],
                                   table)))
    if script and cli:
        print(f"\nscript / cli step time: {script / cli:.3f}")
    print(f"results: {root / 'results.json'}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
