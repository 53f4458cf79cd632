"""Bundled assets of ``slimgrpo demo``: a two-digit addition task and a tiny warm-started model.

    DEMO_DIR/
      data/train.jsonl   2,000 prompts {"prompt": "37+48=", "answer": "85"}
      data/eval.jsonl    200 held-out prompts, disjoint from train
      model/             LlamaForCausalLM (0.13M params, fp32 safetensors) and its
                         character-level PreTrainedTokenizerFast (pad=0, eos=1, no bos)
      model_h32/         its twin for vLLM: the same recipe with 2 attention heads of 32 instead of
                         4 of 16 (vLLM's CPU attention takes head sizes of 32 and up)

All of it is rebuilt by ``scripts/build_demo_model.py``; see ``docs/demo.md``.
"""

from __future__ import annotations

from pathlib import Path

from slimgrpo.demo.task import demo_accuracy, demo_well_formed, make_dataset

DEMO_DIR = Path(__file__).resolve().parent
MODEL_DIR = DEMO_DIR / "model"
VLLM_MODEL_DIR = DEMO_DIR / "model_h32"  # what `slimgrpo demo rollout.engine=vllm` trains (docs/demo.md#on-vllm)
TRAIN_FILE = DEMO_DIR / "data" / "train.jsonl"
EVAL_FILE = DEMO_DIR / "data" / "eval.jsonl"

# How the build script measures held-out accuracy (and how the demo should, to compare):
# EVAL_NUM_SAMPLES completions per eval prompt at temperature 1.0, accuracy = mean reward.
EVAL_NUM_SAMPLES = 8
EVAL_TEMPERATURE = 1.0


def demo_config_dict() -> dict:
    """GRPO settings that lift the bundled model's held-out accuracy by 20+ points fast.

    Measured with the build script's ``--check-grpo`` loop (one optimizer step per batch,
    group-normalised advantages, token-averaged loss, no KL, grad-norm clip 1.0, AdamW
    with constant learning rate): held-out sampled accuracy 28.4% -> 67.0% and greedy
    53.5% -> 87.5% after 150 steps, about a minute on one core; ``slimgrpo demo`` with
    these settings measured 29.5% -> 66.5% and 53.5% -> 84.0%. See docs/demo.md.
    """
    return {
        "learning_rate": 3e-4,
        "num_generations": 8,
        "prompts_per_step": 16,
        "max_steps": 150,
        "max_completion_length": 8,  # answers need at most 4 tokens: 3 digits and EOS
        "temperature": 1.0,
        "beta": 0.0,  # no reference model needed; the task is too short to drift far
        "loss_type": "dapo",  # token-level average over the batch, as in the check
    }


def ppo_settings() -> dict:
    """What ``slimgrpo demo --algorithm ppo`` changes: GAE advantages from a learned critic (full fine-tuning,
    so the critic is a second copy of the tiny model with a value head), two PPO epochs over two
    mini-batches of each rollout, no KL (as the GRPO demo). See docs/ppo.md."""
    return {
        "learning_rate": 3e-4,
        "max_steps": 150,
        "loss": {"advantage_estimator": "gae", "kl_coef": 0.0, "gamma": 1.0, "lam": 0.95,
                 "num_iterations": 2, "steps_per_generation": 2},
        "critic": {"vf_coef": 0.1, "cliprange_value": 0.2},
    }


__all__ = [
    "DEMO_DIR",
    "EVAL_FILE",
    "EVAL_NUM_SAMPLES",
    "EVAL_TEMPERATURE",
    "MODEL_DIR",
    "TRAIN_FILE",
    "VLLM_MODEL_DIR",
    "demo_accuracy",
    "demo_config_dict",
    "demo_well_formed",
    "make_dataset",
    "ppo_settings",
]
