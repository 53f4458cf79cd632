"""A policy that collapses with finite weights (optim.learning_rate=1e30) stops with exit 3, not "done"."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
import yaml

from run_helpers import file_hashes
from slimgrpo.commands.cli import main
from slimgrpo.demo import MODEL_DIR, TRAIN_FILE
from slimgrpo.monitor.health import HealthLimits, collapse_reason, collapse_streaks

LIMITS = HealthLimits(vocab_size=17, max_collapsed_steps=3)
CEILING = math.log(17)


def step(reward=0.3, entropy=0.8, grad_norm=0.5, **extra):
    return {"reward": reward, "entropy": entropy, "grad_norm": grad_norm, "update_skipped": 0, **extra}


COLLAPSED = step(reward=0.0, entropy=CEILING, grad_norm=0.0)


def test_the_lr_1e30_pattern_counts_every_collapsed_step():
    history = [step(reward=0.27), COLLAPSED, COLLAPSED, COLLAPSED]
    assert collapse_streaks(history, LIMITS) == [0, 1, 2, 3]


def test_exploding_gradients_count_too_and_a_healthy_step_resets_the_streak():
    exploded = step(reward=0.0, entropy=0.99 * CEILING, grad_norm=1e6)
    history = [step(reward=0.5), exploded, exploded, step(reward=0.4), exploded]
    assert collapse_streaks(history, LIMITS) == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("name, bad", [
    ("gradient still flowing", step(reward=0.0, entropy=CEILING, grad_norm=0.3)),
    ("entropy below its ceiling", step(reward=0.0, entropy=0.5 * CEILING, grad_norm=0.0)),
    ("reward not at its floor", step(reward=0.2, entropy=CEILING, grad_norm=0.0)),
    ("no numbers (a skipped step)", {"reward": 0.0, "entropy": None, "grad_norm": None, "update_skipped": 1}),
])
def test_one_sign_alone_is_not_a_collapse(name, bad):
    assert collapse_streaks([step(reward=0.1), step(reward=0.3), bad, bad], LIMITS)[-1] == 0, name


def test_a_random_model_with_a_constant_reward_is_not_collapsed():
    """Random-init models start at the entropy ceiling; a constant reward gives zero gradients. The reward
    never fell, so nothing is wrong with the training itself."""
    flat = step(reward=1.0, entropy=CEILING, grad_norm=0.0)
    assert collapse_streaks([flat] * 6, LIMITS) == [0] * 6


def test_max_collapsed_steps_0_only_warns():
    from slimgrpo.monitor.health import HealthMonitor

    monitor = HealthMonitor(HealthLimits(vocab_size=17, max_collapsed_steps=0))
    for i, metrics in enumerate([step(reward=0.27), COLLAPSED, COLLAPSED, COLLAPSED, COLLAPSED], start=1):
        monitor.observe(i, metrics)
    assert monitor.streak == 4 and monitor.first_collapsed_step == 2
    assert not monitor.should_stop and not monitor.in_streak  # checkpoints and final/ as without the guard


def test_the_reason_names_the_signs():
    text = collapse_reason(COLLAPSED, best_reward=0.27, worst_reward=0.27, limits=LIMITS)
    assert "vanished" in text and "100% of its ceiling log(17)" in text and "reward 0.000 at its lowest" in text
    assert collapse_reason(COLLAPSED, None, None, LIMITS) is None  # the first step has nothing to compare with


def write_demo_run(tmp_path, **run) -> str:
    """The bundled demo model (vocabulary 17): at lr=1e30 its weights stay finite and its policy collapses."""
    cfg = {
        "model": {"path": str(MODEL_DIR), "dtype": "float32"},
        "data": {"path": str(TRAIN_FILE), "max_prompt_length": 16},
        "rollout": {"num_generations": 8, "max_completion_length": 8},
        "rewards": {"functions": ["slimgrpo.demo.task:demo_accuracy"]},
        "loss": {"beta": 0.0},
        "optim": {"learning_rate": 3e-4},
        "run": {"max_steps": 2, "batch_size": 32, "save_steps": 1, "save_total_limit": 5, "device": "cpu",
                "output_dir": str(tmp_path / "run"), "seed": 3, "num_threads": 1, **run},
        "log": {"progress": False},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_lr_1e30_stops_with_exit_3_keeping_the_healthy_checkpoint(tmp_path, capsys, caplog):
    threads = torch.get_num_threads()
    try:
        cfg = write_demo_run(tmp_path, save_model=False)
        assert main(["train", cfg]) == 0  # two healthy steps: checkpoints 1 and 2
        run = tmp_path / "run"
        healthy = file_hashes(run / "checkpoints" / "checkpoint-2")
        capsys.readouterr()
        caplog.set_level(logging.WARNING, logger="slimgrpo")
        rc = main(["train", cfg, "run.max_steps=10", "run.save_model=true", "optim.learning_rate=1e30",
                   f"run.resume={run / 'checkpoints' / 'checkpoint-2'}"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert rc == 3, err
    # Step 3's update wrecks the weights; steps 4, 5, 6 sample uniformly with zero gradients: stop at 6.
    assert "step 4: the policy looks collapsed" in caplog.text and "(1 in a row" in caplog.text
    assert "training diverged: stopped at step 6: the policy collapsed for 3 consecutive steps" in err
    assert "optim.learning_rate=1e+30, is far too high" in err
    assert f"last healthy checkpoint is {run / 'checkpoints' / 'checkpoint-2'}" in err
    assert "(checkpoint-3 holds weights that already sampled collapsed rollouts)" in err and "Traceback" not in err
    assert "best 0.531" in err  # step 2's reward, from before the resume
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["grad_norm"] for r in records[3:6]] == [0.0, 0.0, 0.0]
    # The changed optim.learning_rate of a named checkpoint applies (it used to keep the saved 3e-4).
    assert [r["learning_rate"] for r in records] == [3e-4, 3e-4, 1e30, 1e30, 1e30, 1e30]
    assert not (run / "final").exists() and "done" not in capsys.readouterr().out  # no wrecked model
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert file_hashes(run / "checkpoints" / "checkpoint-2") == healthy


@pytest.mark.parametrize("rate, blamed", [(1e30, True), (1e-6, False)])
def test_the_diagnosis_blames_the_learning_rate_only_when_it_is_high(tmp_path, rate, blamed):
    from slimgrpo.monitor.health import HealthMonitor, collapse_diagnosis

    monitor = HealthMonitor(LIMITS)
    for i, metrics in enumerate([step(), COLLAPSED, COLLAPSED, COLLAPSED], start=1):
        monitor.observe(i, metrics)
    text = collapse_diagnosis(monitor, 4, tmp_path, rate)
    assert ("is far too high" in text) is blamed
    assert ("is not high" in text) is not blamed
