"""Shared pieces of the 2-rank agent tests (DDP and FSDP2, gloo on CPU): a calculator environment, the run's
config, the one-process reference run and the comparison of a 2-rank run with it.

The environment's ``reset`` adds a different observation to each of a prompt's G rows (counted per prompt, so
the same on any number of ranks and after a resume, since a group never straddles ranks or steps), which gives
the group advantages something to work with even when decoding greedily."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from slimgrpo.commands.demo_tools import TOOLS_DIR
from _torchrun import HERE, STALL_REWARD

ENV = '''
import os, time
from collections import Counter

SEEN = Counter()  # prompt -> rows reset so far: row g of a group gets observation g % G


class Calculator:
    def reset(self, prompt, **row):
        SEEN[prompt] += 1
        return ["", "0", "1", "9"][(SEEN[prompt] - 1) % 4]

    def add(self, a: int, b: int) -> int:
        """Add two integers exactly.

        Args:
            a: the first number
            b: the second number
        """
        return int(a) + int(b)


def length_mod(prompts, completions, completion_ids=None, **kwargs):
    return [float(len(ids) % 3) for ids in completion_ids]

''' + STALL_REWARD


def agent_config(tmp_path: Path, name: str, strategy: str, fsdp_generation: str = "gather", **sections) -> dict:
    """The 2-step greedy tool run the equality tests compare; ``sections`` update its sections."""
    (tmp_path / "calc_env.py").write_text(ENV)
    cfg = {
        "model": {"path": str(TOOLS_DIR / "model"), "dtype": "float32"},
        "data": {"path": str(TOOLS_DIR / "data" / "train.jsonl"), "max_prompt_length": 16},
        "rollout": {"num_generations": 4, "max_completion_length": 40, "temperature": 0.0,
                    "environment": "calc_env.py:Calculator", "max_tool_calling_iterations": 2,
                    "tool_timeout_s": None},
        "rewards": {"functions": ["slimgrpo.demo.tools_task:tool_accuracy", "calc_env.py:length_mod"]},
        "loss": {"beta": 0.04, "loss_type": "dapo"},
        "memory": {"micro_batch_size": 3},
        "optim": {"learning_rate": 1e-3, "max_grad_norm": 0.5},
        "distributed": {"strategy": strategy, "fsdp_generation": fsdp_generation},
        "run": {"max_steps": 2, "batch_size": 16, "device": "cpu", "output_dir": str(tmp_path / name),
                "num_threads": 1, "seed": 5},
        "log": {"progress": False, "log_completions_steps": 0},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def write_agent_config(tmp_path: Path, name: str, strategy: str, fsdp_generation: str = "gather",
                       **sections) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(agent_config(tmp_path, name, strategy, fsdp_generation, **sections)))
    return path


def train_one_process(config: Path, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``slimgrpo train`` in one process (no torchrun), with this checkout's src first on the path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "src")])}
    return subprocess.run([sys.executable, "-m", "slimgrpo", "train", str(config)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def step_records(run: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0 and "loss" in r]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def assert_matches_one_process(one_run: Path, two_run: Path) -> None:
    """The 2-rank run logged the same loss and every other numeric metric (timings and memory aside) as the
    one-process run, at every step, and ended with the same weights; the tool was called, the groups had
    something to learn and the weights moved, so the comparison is not of two idle runs."""
    one, two = step_records(one_run), step_records(two_run)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    assert any(r["tools/calls_per_completion"] > 0 for r in one), one  # the tool was called
    assert any(abs(r["loss"]) > 0 for r in one), one  # the groups had something to learn
    skip = ("time", "memory", "throughput", "tokens_per_s", "peak", "elapsed", "/s")
    for a, b in zip(one, two):
        keys = [k for k, v in a.items() if isinstance(v, (int, float)) and not any(s in k for s in skip)]
        assert "loss" in keys and "tools/failed_calls" in keys
        for k in keys:
            assert b.get(k) == pytest.approx(a[k], rel=1e-4, abs=1e-6), (k, a, b)

    w1, w2 = final_weights(one_run), final_weights(two_run)
    assert sorted(w1) == sorted(w2)
    from safetensors.torch import load_file

    start = load_file(str(TOOLS_DIR / "model" / "model.safetensors"))
    assert any(not torch.equal(w1[k], start[k]) for k in w1 if k in start)  # the weights moved
    for k in w1:  # AdamW divides by sqrt(v): an element with a ~0 gradient turns float noise into up to
        # lr=1e-3 of movement, so the bound is a tenth of one step (seen: 1 element in 16,384 off by 1.6e-5)
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-4, msg=lambda m: f"{k}: {m}")
