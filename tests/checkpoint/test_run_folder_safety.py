"""Nothing lost, nothing silent: one writer per run folder, no destructive defaults, resume
refused on config changes, finished runs left alone, rewards that cannot end the run, divergence as an
error (exit 3), and every bad input named (exit 2). Each case runs in seconds on the tiny model."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from run_helpers import PROMPTS, file_hashes, train, write_run
from slimgrpo.commands.cli import main
from slimgrpo.config import ConfigError, load_config
from slimgrpo.rewards import scoring as reward_runner
from slimgrpo.rewards.scoring import RewardFunctionError, RewardRunner
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.checkpoint.run_folder import ResumeConfigError
from slimgrpo.checkpoint.run_lock import LOCK_NAME, RunLock
from slimgrpo.train.runner import run_training

SRC = Path(__file__).resolve().parents[2] / "src"


def run_hashes(run: Path) -> dict[str, str]:
    return {k: v for k, v in file_hashes(run).items() if not k.endswith(LOCK_NAME)}


@pytest.fixture
def finished(tmp_path, tiny_model_dir):
    """A finished 2-step run with checkpoints at steps 1 and 2, final/ and summary.json."""
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 2, "save_steps": 1})
    assert train(cfg) == 0
    return cfg, tmp_path / "run"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


def refused(capsys, cfg, *overrides: str) -> str:
    """``slimgrpo train cfg overrides...`` exits 2 (a bad input named); its one-line error."""
    assert train(cfg, *overrides) == 2
    return one_line_error(capsys)


# ----------------------------------------------------------------------------- one writer per folder


def test_second_run_in_a_locked_folder_exits_2_naming_the_holder(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1})
    (tmp_path / "run").mkdir()
    with RunLock(tmp_path / "run"):  # another writer (this process, another open file)
        assert train(cfg) == 2
    err = one_line_error(capsys)
    assert f"is in use by pid {os.getpid()} on host" in err and "started" in err and "run.output_dir" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_lock_is_released_after_success_and_after_an_error(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1})
    assert train(cfg) == 0
    RunLock(tmp_path / "run").acquire().release()  # free again
    assert train(cfg, "optim.learning_rate=0.5") == 2  # refused resume: still released
    RunLock(tmp_path / "run").acquire().release()


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, tiny_model_dir, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                             "started": "2026-01-01T00:00:00"}))
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1})
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert train(cfg) == 0
    assert f"taking over the lock left by pid {dead.pid}" in caplog.text and "no longer running" in caplog.text


# ----------------------------------------------------------------------------- safe re-runs


def test_resume_with_a_changed_config_is_refused_with_the_keys(finished, capsys):
    cfg, run = finished
    before = run_hashes(run)
    err = refused(capsys, cfg, "optim.learning_rate=0.02", "run.seed=6", "run.max_steps=4")
    assert "optim.learning_rate: 0.01 -> 0.02" in err and "run.seed: 5 -> 6" in err
    assert "run.max_steps" not in err.split("Keys that may change")[0]  # resumable: not listed as a difference
    assert "run.resume=never run.overwrite=true" in err and "new run.output_dir" in err
    assert run_hashes(run) == before


def test_a_named_checkpoint_may_resume_with_changes_on_purpose(finished, caplog, capsys):
    cfg, run = finished
    first = run / "checkpoints" / "checkpoint-1"
    err = refused(capsys, cfg, "optim.learning_rate=0.02")
    assert f"name the checkpoint: run.resume={run / 'checkpoints' / 'checkpoint-2'}" in err
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert train(cfg, f"run.resume={first}", "optim.learning_rate=0.02") == 0
    assert f"resuming from {first}, named by run.resume, with a changed config: optim.learning_rate: 0.01 -> 0.02" \
        in caplog.text


def test_python_api_raises_the_same_config_errors(finished, caplog):
    cfg, run = finished
    with pytest.raises(ResumeConfigError) as e:
        run_training(load_config(cfg, ["loss.beta=0.1"]))
    assert isinstance(e.value, ConfigError) and e.value.differences == [("loss.beta", 0.04, 0.1)]
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        summary = run_training(load_config(cfg))
    assert summary["already_finished"] and summary["steps"] == 2
    assert "already finished at step 2" in caplog.text and "nothing to do" in caplog.text


def test_finished_run_rerun_says_so_and_rewrites_nothing(finished, capsys):
    cfg, run = finished
    before = run_hashes(run)
    assert train(cfg, "log.logging_steps=2") == 0  # a resumable key may differ
    out = capsys.readouterr().out
    assert "already finished at step 2; nothing to do" in out and "done:" not in out
    assert run_hashes(run) == before


def test_finished_run_with_more_steps_continues(finished):
    cfg, run = finished
    assert train(cfg, "run.max_steps=3") == 0
    assert [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_fresh_start_in_a_used_folder_refuses_then_overwrite_moves_it_aside(finished, capsys):
    cfg, run = finished
    before = run_hashes(run)
    err = refused(capsys, cfg, "run.resume=never")
    assert "holds an earlier run" in err and "run.overwrite=true" in err and "nothing was changed" in err
    assert run_hashes(run) == before
    assert train(cfg, "run.resume=never", "run.overwrite=true") == 0
    aside = [p for p in run.parent.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and run_hashes(aside[0]) == before  # moved, byte for byte, nothing deleted
    assert (run / "final").is_dir()


def test_finished_run_without_checkpoints_is_not_retrained_over(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1, "save_checkpoints": False})
    assert train(cfg) == 0
    run = tmp_path / "run"
    before = run_hashes(run)
    assert train(cfg, "run.max_steps=2") == 2  # nothing to resume from: a retrain would replace final/
    err = one_line_error(capsys)
    assert "no checkpoint to continue from" in err and "run.overwrite=true" in err
    assert run_hashes(run) == before


def test_demo_refuses_an_existing_run_folder_before_any_work(finished, capsys):
    _, run = finished
    before = run_hashes(run)
    assert main(["demo", "--output-dir", str(run)]) == 2
    err = one_line_error(capsys)
    assert "holds an earlier run" in err and "--output-dir" in err and "run.overwrite=true" in err
    assert "held-out accuracy" not in capsys.readouterr().out
    assert run_hashes(run) == before


# ----------------------------------------------------------------------------- rewards cannot end the run

EXITING = '''
import os, sys

def good(prompts, completions, **kw):
    return [len(c) / 10 for c in completions]

def exits(prompts, completions, **kw):
    sys.exit(0)

def exits3(prompts, completions, **kw):
    sys.exit(3)

def interrupts(prompts, completions, **kw):
    raise KeyboardInterrupt

def hard_exit(prompts, completions, **kw):
    os._exit(0)

def never(prompts, completions, **kw):
    return [None] * len(completions)

def fails(prompts, completions, **kw):
    raise ValueError("always")

def huge(prompts, completions, **kw):
    return [1e40] * len(completions)
'''


@pytest.mark.parametrize("function", ["exits", "exits3", "interrupts"])
def test_reward_calling_sys_exit_or_raising_keyboardinterrupt_is_a_fault(tmp_path, tiny_model_dir, capsys,
                                                                          function):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=EXITING, run={"max_steps": 1},
                    rewards={"functions": ["my_rewards.py:good", f"my_rewards.py:{function}"]})
    err = refused(capsys, cfg)
    assert f"reward function '{function}' failed (exception)" in err
    assert ("SystemExit" in err) or ("KeyboardInterrupt" in err)
    assert not (tmp_path / "run" / "final").exists()


def test_reward_faults_from_base_exceptions_follow_on_error():
    def exits(prompts, completions, **kw):
        raise SystemExit(0)

    out = RewardRunner([("exits", exits), ("one", lambda prompts, completions, **kw: [1.0] * len(completions))],
                       on_error="zero").score(["p"], ["a", "b"], None)
    assert out.fault_counts == {"exits/exception": 2} and out.total.tolist() == [1.0, 1.0]


def test_reward_calling_os_exit_cannot_end_the_run(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=EXITING, run={"max_steps": 1},
                    rewards={"functions": ["my_rewards.py:good", "my_rewards.py:hard_exit"]})
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-m", "slimgrpo", "train", str(cfg)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "reward function 'hard_exit' failed (exception)" in out.stderr and "os._exit(0)" in out.stderr


def test_slow_reward_shows_a_heartbeat_and_default_timeout(monkeypatch, caplog):
    import time

    monkeypatch.setattr(reward_runner, "HEARTBEAT_S", 0.05)

    def slow(prompts, completions, **kw):
        time.sleep(0.3)
        return [1.0] * len(completions)

    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        out = RewardRunner([("slow", slow)], timeout_s=5).score(["p"], ["a"], None)
    assert out.total.tolist() == [1.0]
    assert "reward function 'slow' still running after 0 s (rewards.timeout_s=5)" in caplog.text
    assert load_config(None, validate=False).rewards.timeout_s == 120.0


def test_reward_always_none_warns_then_stops(tmp_path, tiny_model_dir, capsys, caplog):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=EXITING, run={"max_steps": 3},
                    rewards={"functions": ["my_rewards.py:good", "my_rewards.py:never"], "max_failed_steps": 2})
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert train(cfg) == 2
    assert "reward function 'never' gave no usable value this step: it returned None for all 8 completions " \
           "(1 step in a row; the run stops after 2 in a row" in caplog.text
    err = one_line_error(capsys)
    assert "reward function 'never' gave no usable value for 2 steps in a row" in err
    assert "rewards.max_failed_steps" in err


def test_reward_always_failing_under_on_error_zero_warns_naming_it(tmp_path, tiny_model_dir, caplog):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=EXITING, run={"max_steps": 2},
                    rewards={"functions": ["my_rewards.py:good", "my_rewards.py:fails"], "on_error": "zero"})
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert train(cfg) == 0  # below rewards.max_failed_steps (10): a loud warning each step
    assert "reward function 'fails' gave no usable value this step: all 8 values were faults " \
           "(rewards.on_error=zero) (2 steps in a row" in caplog.text


def test_reward_too_large_for_float32_is_a_fault_naming_the_function(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, reward_code=EXITING, run={"max_steps": 1},
                    rewards={"functions": ["my_rewards.py:good", "my_rewards.py:huge"]})
    err = refused(capsys, cfg)
    assert "reward function 'huge' failed (non_finite)" in err and "too large for float32" in err
    out = RewardRunner([("huge", lambda prompts, completions, **kw: [1e40] * len(completions))],
                       on_error="skip").score(["p"], ["a"], None)
    assert out.fault_counts["huge/non_finite"] == 1


def test_one_rewards_in_place_edits_do_not_reach_the_next():
    seen = {}

    def vandal(prompts, completions, completion_ids, **kw):
        prompts[0] = "changed"
        completions[0][0]["content"] = "changed"
        completion_ids[0].append(999)
        kw["answer"][0] = "changed"
        return [0.0] * len(completions)

    def reader(prompts, completions, completion_ids, **kw):
        seen.update(prompt=prompts[0], completion=completions[0][0]["content"], ids=completion_ids[0],
                    answer=kw["answer"][0])
        return [1.0] * len(completions)

    completions = [[{"role": "assistant", "content": "orig"}], [{"role": "assistant", "content": "x"}]]
    RewardRunner([("vandal", vandal), ("reader", reader)]).score(["p", "q"], completions, [[1, 2], [3]],
                                                                {"answer": ["a", "b"]})
    assert seen == {"prompt": "p", "completion": "orig", "ids": [1, 2], "answer": "a"}
    assert completions[0][0]["content"] == "orig"  # the caller's data too


# ----------------------------------------------------------------------------- divergence


def test_learning_rate_that_destroys_the_model_exits_3_not_done(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, optim={"learning_rate": 1e30, "lr_scheduler_type": "constant",
                                                     "warmup_steps": 0}, run={"max_steps": 2})
    assert train(cfg) == 3
    captured = capsys.readouterr()
    assert "training diverged" in captured.err and "done:" not in captured.out
    assert not (tmp_path / "run" / "final").exists()


def test_float16_on_cpu_is_refused_at_validation(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, model={"dtype": "float16"}, run={"device": "cpu"})
    err = refused(capsys, cfg)
    assert "model.dtype=float16" in err and "use model.dtype=float32" in err


# ----------------------------------------------------------------------------- every error named


def test_output_dir_that_is_a_file(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    (tmp_path / "afile").write_text("mine")
    assert "is a file, not a folder" in refused(capsys, cfg, f"run.output_dir={tmp_path / 'afile'}")
    assert (tmp_path / "afile").read_text() == "mine"


def test_read_only_output_dir(tmp_path, tiny_model_dir, capsys, monkeypatch):
    real = Path.write_text

    def read_only(self, *a, **k):
        if self.name == ".slimgrpo-write-test":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", read_only)  # running as root: chmod would not stop us
    cfg = write_run(tmp_path, tiny_model_dir)
    err = refused(capsys, cfg)
    assert "cannot write to the run folder" in err and "read-only file system" in err and "run.output_dir" in err


def test_disk_full_during_a_save(tmp_path, tiny_model_dir, capsys, monkeypatch):
    real = ckpt.save_file

    def full(tensors, path, *a, **k):
        if "checkpoint-2" in path:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(ckpt, "save_file", full)
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 2, "save_steps": 1})
    err = refused(capsys, cfg)
    assert "No space left on device" in err and "checkpoint-2" in err and "free disk space" in err
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["checkpoint-1"] and ckpt.is_valid(root / "checkpoint-1")


def test_truncated_model_safetensors(tmp_path, tiny_model_dir, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cfg = write_run(tmp_path, model)
    err = refused(capsys, cfg)
    assert "model.safetensors cannot be read" in err and "truncated or corrupt" in err


def test_non_utf8_data_names_file_and_line(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    (tmp_path / "prompts.jsonl").write_bytes(b'{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "caf\xe9"}\n')
    err = refused(capsys, cfg)
    assert "prompts.jsonl: line 3 is not valid UTF-8 (byte 0xe9" in err and "iconv" in err


def test_model_path_pointing_at_a_file(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    err = refused(capsys, cfg, f"model.path={tiny_model_dir / 'config.json'}")
    assert "is a file" in err and f"model.path='{tiny_model_dir}'" in err


def test_config_path_that_is_a_folder(tmp_path, tiny_model_dir, capsys):
    write_run(tmp_path, tiny_model_dir)
    err = refused(capsys, tmp_path)
    assert "is a folder, not a YAML file" in err and "cfg.yaml" in err


def test_reward_spec_naming_a_file_without_function(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    err = refused(capsys, cfg, "rewards.functions=[my_rewards.py]")
    assert "'my_rewards.py:vowels'" in err and "rewards:py" not in err


def test_eval_of_a_checkpoint_without_a_config(finished, capsys, tmp_path):
    _, run = finished
    args = ["--data", str(tmp_path / "prompts.jsonl"), "--rewards", "length", "--limit", "2"]
    assert main(["eval", "--model", str(run / "checkpoints" / "checkpoint-2"), *args]) == 0  # tokenizer: final/
    bare = tmp_path / "bare"
    shutil.copytree(run / "checkpoints" / "checkpoint-2" / "model", bare)
    capsys.readouterr()
    assert main(["eval", "--model", str(bare), *args]) == 2
    err = one_line_error(capsys)
    assert "no tokenizer found" in err and "model.tokenizer_path" in err


# ----------------------------------------------------------------------------- silent acceptances


def test_duplicate_yaml_section_names_the_lines(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    cfg.write_text(cfg.read_text() + "run:\n  seed: 9\n")
    err = refused(capsys, cfg)
    assert "key 'run' appears twice (lines" in err and "cfg.yaml" in err


def test_empty_output_dir(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    assert "run.output_dir is empty" in refused(capsys, cfg, "run.output_dir=")


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_num_threads_zero_or_negative(tmp_path, tiny_model_dir, capsys, threads):
    cfg = write_run(tmp_path, tiny_model_dir)
    err = refused(capsys, cfg, f"run.num_threads={threads}")
    assert f"run.num_threads must be >= 1 (or null for torch's default), got {threads}" in err


def test_ragged_csv_row(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir)
    (tmp_path / "p.csv").write_text("prompt,answer\nWhat is 1 plus 2?,3\nWhat is 3, plus 4?,7\n")
    assert train(cfg, f"data.path={tmp_path / 'p.csv'}") == 2  # (an override is taken from the working directory)
    err = one_line_error(capsys)
    assert "p.csv: row 2 (line 3) has 3 fields, the header has 2" in err and "quote" in err


def test_fewer_prompts_than_a_step_needs(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, prompts=PROMPTS[:1])
    assert train(cfg) == 2  # batch_size 8 / 4 generations = 2 prompts per step
    err = one_line_error(capsys)
    assert "the dataset has 1 prompt, but each step needs 2" in err and "run.batch_size to 4" in err


def test_progress_false_keeps_the_metric_lines(tmp_path, tiny_model_dir, capsys):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 2}, log={"progress": False})
    assert train(cfg) == 0
    out = capsys.readouterr().out
    assert "step 1:  reward" in out and "step 2:  reward" in out


def test_resumable_keys_are_documented():
    from slimgrpo.checkpoint.run_folder import RESUMABLE_KEYS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text()
    assert all(f"`{k}`" in doc for k in RESUMABLE_KEYS), [k for k in RESUMABLE_KEYS if f"`{k}`" not in doc]
