"""``slimgrpo demo --task tools``: GRPO teaches a tiny model when to call a calculator tool.

Held-out accuracy and the share of completions that call the tool (on four-digit and on one-digit sums)
are measured with the multi-turn rollout before and after training.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from slimgrpo.config import from_dict, merge_overrides, validate_config
from slimgrpo.config.paths import shown
from slimgrpo.data import load_prompt_dataset
from slimgrpo.demo import DEMO_DIR
from slimgrpo.demo.tools_task import tool_accuracy
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.output.console import quiet_third_party
from slimgrpo.train.trainer import Trainer
from slimgrpo.units import human_duration

TOOLS_DIR = DEMO_DIR / "tools"
EVAL_SAMPLES = 4


def tools_demo_config(output_dir: str, overrides: list[str]):
    data: dict[str, Any] = {
        "model": {"path": str(TOOLS_DIR / "model"), "dtype": "float32"},
        "data": {"path": str(TOOLS_DIR / "data" / "train.jsonl"), "prompt_column": "prompt",
                 "max_prompt_length": 16},
        "rollout": {"num_generations": 8, "max_completion_length": 40, "temperature": 1.0,
                    "tools": ["slimgrpo.demo.tools_task:add"], "max_tool_calling_iterations": 2,
                    "tool_timeout_s": None},
        "rewards": {"functions": ["slimgrpo.demo.tools_task:tool_accuracy"]},
        "loss": {"beta": 0.0, "loss_type": "dapo"},
        "optim": {"learning_rate": 1e-3},
        "run": {"output_dir": output_dir, "max_steps": 40, "resume": "never", "device": "cpu",
                "batch_size": 128, "save_steps": 0},
        "log": {"logging_steps": 5, "log_completions_steps": 10},
    }
    cfg = from_dict(merge_overrides(data, overrides))
    validate_config(cfg)
    return cfg


def measure(trainer: Trainer, dataset, temperature: float, samples: int, seed: int) -> dict[str, float]:
    """Accuracy, and the share of completions calling the tool on hard and easy prompts."""
    tok = trainer.policy.tokenizer
    params = SamplingParams(max_new_tokens=trainer.cfg.rollout.max_completion_length, temperature=temperature,
                            eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    gen = torch.Generator(device=trainer.policy.device).manual_seed(seed)  # where the model samples
    correct, calls = [], {"hard": [], "easy": []}
    for start in range(0, len(dataset), 50):
        batch = dataset.batch(list(range(start, min(start + 50, len(dataset)))))
        rollout = trainer.agent.generate(batch, samples, params, gen)
        answers = [a for a in batch.columns["answer"] for _ in range(samples)]
        correct += tool_accuracy(None, rollout.conversations, answers)
        for i, conv in enumerate(rollout.conversations):
            kind = "hard" if len(batch.prompts[i // samples]) > 6 else "easy"
            calls[kind].append(float(any(m["role"] == "tool" for m in conv)))
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    return {"accuracy": mean(correct), "calls_hard": mean(calls["hard"]), "calls_easy": mean(calls["easy"])}


def run_tool_demo(output_dir: str = "outputs/demo-tools", overrides: list[str] | None = None) -> int:
    console = Console()
    t0 = time.perf_counter()
    cfg = tools_demo_config(output_dir, overrides or [])
    quiet_third_party(cfg.log.verbose)  # no transformers progress bars or torch warnings unless log.verbose=true
    console.print(f"[bold]slimgrpo demo --task tools[/bold]: GRPO teaches a tiny model to call a calculator, "
                  f"CPU, {cfg.run.max_steps} steps")
    trainer = Trainer(cfg)
    eval_file = Path(cfg.data.path).parent / "eval.jsonl"  # beside the training prompts
    eval_set = load_prompt_dataset(str(eval_file), trainer.policy.tokenizer, cfg.data)
    T = cfg.rollout.temperature
    def both() -> dict[str, dict[str, float]]:
        return {"sampled": measure(trainer, eval_set, T, EVAL_SAMPLES, 7),
                "greedy": measure(trainer, eval_set, 0.0, 1, 7)}

    before = both()
    # the same line, in the same order, as the main demo's (output/console.py's evaluation before training)
    console.print(f"eval before training: greedy {before['greedy']['accuracy']:.1%}  "
                  f"sampled {before['sampled']['accuracy']:.1%}  ({len(eval_set)} held-out prompts)")
    summary = trainer.train()
    after = both()
    table = Table(title=f"held-out, {len(eval_set)} prompts")
    for col in ("measure", "before", "after", "change"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for mode in ("sampled", "greedy"):
        for key, label in (("accuracy", "accuracy"), ("calls_hard", "calls tool, 4-digit"),
                           ("calls_easy", "calls tool, 1-digit")):
            b, a = before[mode][key], after[mode][key]
            name = f"{label} ({'T=%g, %d/prompt' % (T, EVAL_SAMPLES) if mode == 'sampled' else 'greedy'})"
            table.add_row(name, f"{b:.1%}", f"{a:.1%}", f"{(a - b) * 100:+.1f} pts")
    console.print(table)
    wall = time.perf_counter() - t0
    summary.update({"eval_before": before, "eval_after": after, "wall_time_s": wall})
    out = Path(shown(cfg.run.output_dir))  # outputs/demo-tools, as typed, when below the working directory
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"wall time {human_duration(wall)}; metrics in {out / 'metrics.jsonl'}, conversations in "
                  f"{out / 'completions.jsonl'}\nnext: slimgrpo report {out}   (plots and samples as one HTML page); "
                  f"the trained model is in {out / 'final'}", soft_wrap=True)
    return 0
