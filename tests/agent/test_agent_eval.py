"""Evaluation of a tool-using model runs the same multi-turn rollout as training: `slimgrpo eval` with
rollout.tools in its config, and eval.data during training. Uses the tool demo's bundled model, which
calls its calculator on a good share of 4-digit sums."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from slimgrpo.commands.cli import main
from slimgrpo.commands.demo_tools import TOOLS_DIR

pytestmark = pytest.mark.skipif(not (TOOLS_DIR / "model" / "model.safetensors").exists(),
                                reason="tool demo assets not built")

# Scores 1.0 when the conversation holds a tool result: only a multi-turn rollout with the tools can.
REWARDS = '''
def called_tool(completions, **kwargs):
    return [float(isinstance(c, list) and any(m["role"] == "tool" for m in c)) for c in completions]


def answered(completions, answer, **kwargs):
    return [float(isinstance(c, list) and c[-1]["content"].strip() == a) for c, a in zip(completions, answer)]
'''


def write_config(tmp_path, **extra) -> str:
    (tmp_path / "rw.py").write_text(REWARDS)
    cfg = {
        "model": {"path": str(TOOLS_DIR / "model"), "dtype": "float32"},
        "data": {"path": str(TOOLS_DIR / "data" / "eval.jsonl"), "max_prompt_length": 16},
        "rollout": {"num_generations": 4, "max_completion_length": 40, "tools": ["slimgrpo.demo.tools_task:add"],
                    "max_tool_calling_iterations": 2, "tool_timeout_s": None},
        "rewards": {"functions": ["rw.py:called_tool", "rw.py:answered"]},
        "run": {"device": "cpu", "max_steps": 1, "batch_size": 16, "output_dir": str(tmp_path / "run"),
                "save_checkpoints": False, "save_model": False},
        "log": {"progress": False},
        **extra,
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "cfg.yaml")


def test_slimgrpo_eval_uses_the_tools_of_the_config(tmp_path):
    threads = torch.get_num_threads()
    try:
        rc = main(["eval", write_config(tmp_path), "--limit", "20", "--num-samples", "4", "--k", "1", "4",
                   "--json", str(tmp_path / "out.json")])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    result = next(iter(json.loads((tmp_path / "out.json").read_text()).values()))
    assert result["rewards/called_tool"] > 0.05  # conversations with tool results: the agent rollout ran
    assert result["rewards/answered"] > 0.0  # and the answers after them are scored


def test_eval_during_training_uses_the_agent_rollout(tmp_path):
    from slimgrpo.config import load_config
    from slimgrpo.train.trainer import Trainer

    threads = torch.get_num_threads()
    try:
        cfg = load_config(write_config(tmp_path, eval={"data": str(TOOLS_DIR / "data" / "eval.jsonl"),
                                                       "max_prompts": 16, "num_samples": 2}))
        trainer = Trainer(cfg)  # built whole: the folder locked until train() ends (released below)
        got = trainer.evaluator.run()
        trainer.checkpoints.release()
    finally:
        torch.set_num_threads(threads)
    assert got["eval/rewards/called_tool"] > 0.05 and got["eval/accuracy_sampled"] > 0.05
