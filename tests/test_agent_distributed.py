"""Tool-calling rollouts under torchrun (DDP, gloo on CPU): every rank runs its own rows' conversations and
tools on its full copy of the model; gradients are all-reduced as for single-turn rows."""

from __future__ import annotations

import json

import pytest
import yaml

from slimgrpo.demo.tools_run import TOOLS_DIR
from test_distributed import finish, torchrun

pytestmark = pytest.mark.skipif(not (TOOLS_DIR / "model" / "model.safetensors").exists(),
                                reason="tool demo assets not built")


def test_tool_rollouts_train_and_evaluate_under_ddp(tmp_path):
    cfg = {
        "model": {"path": str(TOOLS_DIR / "model"), "dtype": "float32"},
        "data": {"path": str(TOOLS_DIR / "data" / "train.jsonl"), "max_prompt_length": 16},
        "rollout": {"num_generations": 8, "max_completion_length": 40, "tools": ["slimgrpo.demo.tools_task:add"],
                    "max_tool_calling_iterations": 2, "tool_timeout_s": None},
        "rewards": {"functions": ["slimgrpo.demo.tools_task:tool_accuracy"]},
        "loss": {"beta": 0.0, "loss_type": "dapo"},
        "optim": {"learning_rate": 1e-3},
        "distributed": {"strategy": "ddp"},
        "eval": {"data": str(TOOLS_DIR / "data" / "eval.jsonl"), "max_prompts": 8, "num_samples": 2},
        "run": {"max_steps": 2, "batch_size": 32, "device": "cpu", "output_dir": str(tmp_path / "run"),
                "num_threads": 1},
        "log": {"progress": False, "log_completions_steps": 0},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    code, log = finish(torchrun(["-m", "slimgrpo", "train", str(tmp_path / "cfg.yaml")], tmp_path, timeout=240),
                       timeout=240)
    assert code == 0, log[-6000:]
    assert "2 processes (ddp)" in log
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0 and "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["tools/calls_per_completion"] > 0 for r in steps)  # the model called its calculator
    assert records[0]["step"] == 0 and records[0]["eval/accuracy_sampled"] > 0  # eval with the agent rollout
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
