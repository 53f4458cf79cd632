"""A few GRPO steps on a tiny model: parameters change, metrics.jsonl has the per-reward keys, the saved
model loads again, and resume continues where it stopped."""

import json

import pytest
import torch
import yaml

from conftest import GSM8K_TEST, needs_gsm8k
from slimgrpo.config import load_config
from slimgrpo.train.runner import run_training

pytestmark = needs_gsm8k  # every test here trains on GSM8K's prompts


REWARD_FILE = """
def vowel_share(prompts, completions, completion_ids=None, **kwargs):
    # varies from completion to completion even for a random model, so groups carry signal
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]
"""


def make_config(tmp_path, model_dir, *overrides):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    data = {
        "model": {"path": str(model_dir)},
        "data": {"path": str(GSM8K_TEST), "prompt_template": "Q: {question}\nA:", "max_prompt_length": 48,
                 "max_samples": 16},
        "rollout": {"num_generations": 4, "max_completion_length": 12},
        "rewards": {"functions": ["gsm8k_accuracy", "format_lenient", "length", "my_rewards.py:vowel_share"]},
        "optim": {"learning_rate": 1e-3},
        "run": {"max_steps": 3, "batch_size": 8, "output_dir": str(tmp_path / "run"), "seed": 0},
        "log": {"progress": False, "log_completions_steps": 1},
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_config(p, list(overrides))


def weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_three_steps_train_log_and_save(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "loss.beta=0.04")
    summary = run_training(cfg)
    run = tmp_path / "run"
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("rewards/gsm8k_accuracy/mean", "rewards/gsm8k_accuracy/std", "rewards/format_lenient/mean",
                "rewards/length/mean", "rewards/vowel_share/mean", "reward", "frac_reward_zero_std", "kl", "clip_ratio/low_mean",
                "clip_ratio/high_mean", "completions/mean_length", "completions/min_length",
                "completions/max_length", "completions/clipped_ratio", "entropy", "grad_norm", "learning_rate",
                "gen/tokens_per_s", "time/step_s", "memory/peak_mib"):
        assert key in records[-1], key
    assert records[-1]["kl"] is not None and records[-1]["kl"] >= 0
    assert summary["steps"] == 3 and (run / "summary.json").is_file()
    before, after = weights(tiny_model_dir), weights(run / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "training changed no parameter"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(run / "final"))  # loads with plain transformers
    assert (run / "completions.jsonl").is_file() and (run / "config.yaml").is_file()


def test_lora_run_saves_adapter_that_peft_loads(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "lora.enabled=true", "lora.r=4", "loss.beta=0.04",
                      "run.max_steps=2", "memory.micro_batch_size=3")
    run_training(cfg)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    PeftModel.from_pretrained(base, str(tmp_path / "run" / "final"))


def test_resume_continues_from_checkpoint(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=2", "run.save_steps=1")
    run_training(cfg)
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=3", "run.save_steps=1")
    summary = run_training(cfg)
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3] and summary["steps"] == 3
