"""Tool-calling rollouts under torchrun (DDP, gloo on CPU): every rank runs its own rows' conversations and
tools on its full copy of the model; gradients are all-reduced as for single-turn rows.

* a 2-rank run trains and evaluates with the agent rollout;
* 2 ranks with half the prompts each train to the same loss, every logged metric and the same final weights as
  one process with all of them (greedy decoding, as in ``test_agent_fsdp.py``, whose helpers it shares);
* a 2-rank run killed (SIGKILL) after a checkpoint resumes to the weights of an uninterrupted run, with real
  sampling (each rank's generator restored) and an environment in every row."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from _agent_dist_helpers import (assert_matches_one_process, final_weights, train_one_process,
                                 write_agent_config)
from slimgrpo.commands.demo_tools import TOOLS_DIR
from _torchrun import finish, kill_and_resume, torchrun

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (TOOLS_DIR / "model" / "model.safetensors").exists(),
                                 reason="tool demo assets not built")]


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


def test_tool_rollouts_under_ddp_match_one_process(tmp_path):
    two = write_agent_config(tmp_path, "two", "ddp")
    one = write_agent_config(tmp_path, "one", "ddp")
    proc = torchrun(["-m", "slimgrpo", "train", str(two)], tmp_path, timeout=180)
    single = train_one_process(one, tmp_path, timeout=180)  # the reference, while the 2 ranks run
    code, log = finish(proc, timeout=180)
    assert code == 0, log[-6000:]
    assert single.returncode == 0, (single.stdout + single.stderr)[-6000:]
    assert "2 processes (ddp)" in log
    assert_matches_one_process(tmp_path / "one", tmp_path / "two")


# ddp in the fast suite (FSDP2 resume: tests/distributed/); fsdp (40 s on 2 cores) with -m slow
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_killed_tool_run_resumes_to_the_same_weights(tmp_path, strategy):
    """SIGKILL of torchrun and both ranks once checkpoint 2 is complete; the same command resumes and ends where
    an uninterrupted 2-rank run ends. Real sampling (temperature 1), so each rank's generator must come back;
    every row has an environment and tool calls, and the optimizer state is AdamW's after 2 steps (FSDP2:
    sharded, with the multi-turn decoder on gathered weights)."""

    def config(name: str):
        return write_agent_config(tmp_path, name, strategy,
                                  rollout={"temperature": 1.0},
                                  rewards={"functions": ["slimgrpo.demo.tools_task:tool_accuracy",
                                                         "calc_env.py:stalls_after_gate"]},
                                  run={"max_steps": 4, "save_steps": 1, "save_total_limit": 2})

    kill_and_resume(tmp_path, config("straight"), config("broken"), timeout=180, wait=150)

    records = [json.loads(ln) for ln in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert any(r["tools/calls_per_completion"] > 0 for r in records)  # the tool was called
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "broken")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=lambda m: f"{k}: {m}")
