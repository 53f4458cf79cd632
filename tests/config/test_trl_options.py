"""TRL/transformers options: warmup as a ratio, num_train_epochs, repetition_penalty in the config."""

import json
import math

import pytest

from slimgrpo.config import ConfigError, from_dict, validate_config
from slimgrpo.data import steps_for_epochs
from slimgrpo.update.optim import lr_lambda, warmup_steps

BASE = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": {"functions": ["length"]}}


def cfg_with(**sections):
    data = {k: dict(v) for k, v in BASE.items()}
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    cfg = from_dict(data)
    validate_config(cfg)
    return cfg


@pytest.mark.parametrize("optim, expected", [
    ({"warmup_steps": 7}, 7),
    ({"warmup_steps": 0.1}, 10),      # transformers: a value below 1 is a ratio, rounded up
    ({"warmup_steps": 0.015}, 2),
    ({"warmup_ratio": 0.25}, 25),
    ({}, 0),
])
def test_warmup_steps_as_transformers(optim, expected):
    cfg = cfg_with(optim=optim, run={"max_steps": 100})
    assert warmup_steps(cfg) == expected
    if expected:
        assert lr_lambda(0, cfg) == pytest.approx(1 / expected)
        assert lr_lambda(expected - 1, cfg) == 1.0


def test_warmup_bad_values():
    with pytest.raises(ConfigError, match="not both"):
        cfg_with(optim={"warmup_steps": 3, "warmup_ratio": 0.1})
    with pytest.raises(ConfigError, match="warmup_ratio"):
        cfg_with(optim={"warmup_ratio": 1.5})
    with pytest.raises(ConfigError, match="num_train_epochs"):
        cfg_with(run={"num_train_epochs": 0})
    with pytest.raises(ConfigError, match="repetition_penalty"):
        cfg_with(rollout={"repetition_penalty": 0})


def test_steps_for_epochs():
    assert steps_for_epochs(1, 5, 2) == 3
    assert steps_for_epochs(2.5, 100, 8) == math.ceil(250 / 8)
    assert steps_for_epochs(0.01, 5, 2) == 1


def test_num_train_epochs_sets_the_run_length(tmp_path, tiny_model_dir):
    from run_helpers import write_run
    from slimgrpo.config import load_config
    from slimgrpo.train.runner import run_training

    # 5 prompts, 2 prompts per step (batch 8 / 4 generations): 1.6 epochs = 8 prompts = 4 steps
    cfg_path = write_run(tmp_path, tiny_model_dir, rollout={"repetition_penalty": 1.3},
                         run={"num_train_epochs": 1.6, "max_steps": 100, "save_checkpoints": False,
                              "save_model": False})
    summary = run_training(load_config(cfg_path))
    assert summary["steps"] == 4
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4


def test_flash_attention_without_the_package_is_refused_and_plan_says_so(tmp_path, tiny_model_dir):
    import importlib.util

    from run_helpers import cli, write_run

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(ConfigError, match="flash_attn"):
        cfg_with(model={"attn_implementation": "flash_attention_2"})
    cfg_path = write_run(tmp_path, tiny_model_dir)
    plan = cli("plan", str(cfg_path), "model.attn_implementation=flash_attention_2")
    assert "flash_attn" in plan.stdout and "refuses" in plan.stdout, plan.stdout + plan.stderr
    train = cli("train", str(cfg_path), "model.attn_implementation=flash_attention_2")
    assert train.returncode == 2 and "pip install flash-attn" in train.stderr + train.stdout
    assert "internal error" not in train.stderr + train.stdout
