"""Faults inside real training runs: misbehaving reward functions (on_error = raise | zero | skip, with a
timeout) and the non-finite guard (a NaN/inf loss skips the update; K in a row stop the run with the last
good checkpoint intact)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from run_helpers import cli, file_hashes, metrics, write_run
from slimgrpo.commands.cli import main
from slimgrpo.config import load_config
from slimgrpo.train.runner import run_training

FAULTY_REWARDS = '''
import os
import time


def good(prompts, completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]


def raises(prompts, completions, **kwargs):
    raise ValueError("boom")


def nan_first(prompts, completions, **kwargs):
    return [float("nan")] + [1.0] * (len(completions) - 1)


def nothing(prompts, completions, **kwargs):
    return [None] * len(completions)


def short(prompts, completions, **kwargs):
    return [1.0]


def hangs(prompts, completions, **kwargs):
    time.sleep(2.0)
    return [0.0] * len(completions)


def huge(prompts, completions, **kwargs):
    if os.environ.get("TEST_HUGE_REWARDS"):
        return [3e38] * len(completions)  # finite, but their group mean overflows float32
    return good(prompts, completions)
'''

ALL = ["good", "raises", "nan_first", "nothing", "short", "hangs"]


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("on_error", ["zero", "skip"])
def test_reward_faults_are_counted_in_metrics(tmp_path, tiny_model_dir, on_error):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=FAULTY_REWARDS,
                    rewards={"functions": [f"my_rewards.py:{f}" for f in ALL], "on_error": on_error,
                             "timeout_s": 0.5},
                    run={"max_steps": 2}, loss={"beta": 0.0})
    summary = run_training(load_config(cfg))
    assert summary["steps"] == 2
    for record in metrics(tmp_path / "run"):
        rows = 8
        assert record["reward_faults/raises/exception"] == rows
        assert record["reward_faults/nan_first/non_finite"] == 1
        assert record["reward_faults/short/wrong_length"] == rows
        assert record["reward_faults/hangs/timeout"] == rows
        assert not any(k.startswith("reward_faults/nothing") for k in record)  # None = "not applicable"
        assert record["rewards/nothing/mean"] is None
        assert record["rewards/good/mean"] is not None
        if on_error == "zero":
            assert record["rewards/raises/mean"] == 0.0 and record["rewards/hangs/mean"] == 0.0
        else:
            assert record["rewards/raises/mean"] is None and record["rewards/nan_first/mean"] == 1.0
        assert record["update_skipped"] == 0 and record["loss"] is not None


def test_raise_names_function_and_sample_via_cli(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=FAULTY_REWARDS,
                    rewards={"functions": ["my_rewards.py:good", "my_rewards.py:raises"], "on_error": "raise"})
    out = cli("train", str(cfg))
    assert out.returncode == 2, out.stderr
    assert "reward function 'raises' failed (exception)" in out.stderr
    assert "ValueError: boom" in out.stderr and "my_rewards.py, line" in out.stderr
    assert "prompt[0]: What is" in out.stderr and "completion[0]:" in out.stderr
    assert "rewards.on_error" in out.stderr
    assert "Traceback" not in out.stderr and "(run with --debug for the traceback)" in out.stderr


@pytest.mark.parametrize("function, fault, sample", [("nan_first", "non_finite", "sample 0"),
                                                     ("short", "wrong_length", "all 8 samples"),
                                                     ("hangs", "timeout", "all 8 samples")])
def test_raise_on_bad_values_and_timeouts(tmp_path, tiny_model_dir, capsys, function, fault, sample):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=FAULTY_REWARDS,
                    rewards={"functions": ["my_rewards.py:good", f"my_rewards.py:{function}"], "timeout_s": 0.5})
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"reward function '{function}' failed ({fault})" in err and sample in err
    assert "Traceback" not in err


def test_debug_shows_the_reward_functions_own_traceback(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=FAULTY_REWARDS,
                    rewards={"functions": ["my_rewards.py:raises"]})
    assert main(["--debug", "train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise ValueError("boom")' in err


def test_a_nan_loss_skips_one_update_and_training_goes_on(tmp_path, tiny_model_dir, monkeypatch, caplog):
    import slimgrpo.update.gradients as update

    real, calls = update.micro_batch_loss, []

    def nan_on_second_step(*args, **kwargs):  # one micro-batch per step
        calls.append(1)
        loss, stats, entropy = real(*args, **kwargs)
        return (loss * float("nan") if len(calls) == 2 else loss), stats, entropy

    monkeypatch.setattr(update, "micro_batch_loss", nan_on_second_step)
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 3, "max_nonfinite_steps": 2}, loss={"beta": 0.0})
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        run_training(load_config(cfg))
    records = metrics(tmp_path / "run")
    assert [r["update_skipped"] for r in records] == [0, 1, 0]
    assert records[1]["loss"] is None and records[1]["grad_norm"] is None  # NaN is logged as null
    assert "step 2: non-finite loss or gradient, update skipped (1 in a row)" in caplog.text


def test_consecutive_nonfinite_steps_stop_with_last_checkpoint_intact(tmp_path, tiny_model_dir, monkeypatch,
                                                                       capsys):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=FAULTY_REWARDS,
                    rewards={"functions": ["my_rewards.py:huge"]},
                    optim={"lr_scheduler_type": "constant", "warmup_steps": 0},
                    run={"max_steps": 2, "save_steps": 1, "max_nonfinite_steps": 2})
    assert main(["train", str(cfg)]) == 0  # a good start: checkpoints at steps 1 and 2
    run = tmp_path / "run"
    before = file_hashes(run / "checkpoints")

    monkeypatch.setenv("TEST_HUGE_REWARDS", "1")
    assert main(["train", str(cfg), "run.max_steps=6", "run.save_steps=3"]) == 3  # diverged: exit 3
    err = capsys.readouterr().err
    assert "training diverged: stopped at step 4: 2 consecutive steps had a NaN/inf loss or gradient" in err
    assert "checkpoint-2 (step 2), is untouched" in err and "reward values so large" in err
    assert "Traceback" not in err
    # Resumed at 2; step 3 skipped (logged, and its periodic save left out: no checkpoint in the middle of
    # a run of skipped updates); step 4 skipped too, and the run stopped before logging or saving it.
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3] and records[2]["update_skipped"] == 1
    assert file_hashes(run / "checkpoints") == before  # every earlier checkpoint byte-identical
    assert json.loads((run / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())["step"] == 2
