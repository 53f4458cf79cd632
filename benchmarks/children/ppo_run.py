"""One run of speed/ppo_vs_trl.py, a process of its own (its peak RSS is measured from outside):

    python -m benchmarks.children.ppo_run trl SPEC.json       # TRL 1.12's PPOTrainer (its folder on PYTHONPATH)
    python -m benchmarks.children.ppo_run slimgrpo SPEC.json  # SPEC's mode: ppo-lora, ppo-full or grpo-lora

Either prints one ``@@bench`` record at its end: the trainer and the seconds of each optimizer step.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.harness.records import emit
from benchmarks.harness.rewards import DIGIT_REWARD

PROMPTS_PER_STEP = 4


def trl_child(spec: dict) -> None:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast
    from transformers import TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    import trl

    torch.set_num_threads(spec["threads"])
    tok = PreTrainedTokenizerFast.from_pretrained(spec["model"])
    tok.padding_side = "left"
    ds = load_dataset("json", data_files=spec["prompts"], split="train")
    ds = ds.map(lambda r: {"input_ids": tok(r["prompt"])["input_ids"]}, remove_columns=ds.column_names)
    args = PPOConfig(output_dir=spec["out"], per_device_train_batch_size=PROMPTS_PER_STEP,
                     gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=1,
                     total_episodes=PROMPTS_PER_STEP * spec["steps"], response_length=spec["length"],
                     local_rollout_forward_batch_size=PROMPTS_PER_STEP, kl_coef=0.05, learning_rate=1e-6,
                     num_sample_generations=0, use_cpu=True, report_to="none", save_strategy="no",
                     logging_steps=1, disable_tqdm=True, bf16=False, fp16=False, seed=0)
    load = dict(dtype=torch.float32)
    policy = AutoModelForCausalLM.from_pretrained(spec["model"], **load)
    ref = AutoModelForCausalLM.from_pretrained(spec["model"], **load)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1, **load)
    value = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1, **load)
    for m in (policy, ref, reward, value):
        m.config.pad_token_id = tok.pad_token_id
    marks = []

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=ds, callbacks=[Timer()])
    trainer.train()
    steps = [b - a for a, b in zip(marks, marks[1:])]
    emit({"event": "end", "trainer": f"trl {trl.__version__}", "step_s": steps})


def slimgrpo_config(spec: dict):
    """The slimgrpo run of ``spec["mode"]``: ppo-lora, ppo-full or grpo-lora."""
    from benchmarks.surface import from_dict, validate_config

    ppo, lora = spec["mode"].startswith("ppo"), spec["mode"].endswith("lora")
    G = 1 if ppo else 4
    L = spec["length"]
    cfg = from_dict({
        "model": {"path": spec["model"], "dtype": "float32"},
        "lora": {"enabled": lora, "r": 16, "alpha": 32.0, "dropout": 0.0},
        "data": {"path": spec["prompts"], "prompt_column": "prompt", "shuffle": False, "use_chat_template": "never"},
        "rollout": {"num_generations": G, "max_completion_length": L, "min_completion_length": L},
        "rewards": {"functions": [DIGIT_REWARD]},
        "loss": ({"advantage_estimator": "gae", "kl_coef": 0.05, "beta": 0.0} if ppo else {"beta": 0.04}),
        "optim": {"learning_rate": 1e-6},
        "run": {"output_dir": spec["out"], "max_steps": spec["steps"], "batch_size": PROMPTS_PER_STEP * G,
                "device": "cpu", "num_threads": spec["threads"], "save_model": False, "resume": "never",
                "save_steps": 0, "save_checkpoints": False},
        "log": {"progress": False, "log_completions_steps": 0},
    })
    validate_config(cfg)
    return cfg


def slimgrpo_child(spec: dict) -> None:
    import slimgrpo  # noqa: F401  (before torch, as the CLI)

    from benchmarks.surface import Trainer

    marks = []
    trainer = Trainer(slimgrpo_config(spec), callbacks=[lambda t, step, m: marks.append(m["time/step_s"])])
    trainer.train()
    emit({"event": "end", "trainer": spec["mode"], "step_s": marks})


def main(argv: list[str]) -> int:
    trainer, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    {"trl": trl_child, "slimgrpo": slimgrpo_child}[trainer](spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
