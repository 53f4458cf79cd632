"""Preemption: SIGTERM / SIGINT finish the current step, save a checkpoint, say how to resume and exit 0;
a second signal stops at once."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from run_helpers import cli, metrics, write_run
from slimgrpo.commands.cli import main
from slimgrpo.checkpoint import format as ckpt


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_sigterm_then_sigint_save_and_exit_zero(tmp_path, tiny_model_dir, monkeypatch, capsys, keep_threads):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 6, "save_steps": 0})
    run = tmp_path / "run"

    # SIGTERM arrives in the middle of step 2 (during its reward call), in a real CLI process.
    out = cli("train", str(cfg), env={"TEST_SIGNAL_AT_CALL": "TERM:2"})
    assert out.returncode == 0, out.stderr
    assert "received SIGTERM: finishing this step" in out.stderr
    assert "stopped by SIGTERM at step 2 of 6" in out.stdout
    assert f"run the same command again: slimgrpo train {cfg}" in out.stderr
    assert [p.name for p in ckpt.list_complete(run / "checkpoints")] == ["checkpoint-2"]
    assert ckpt.is_valid(run / "checkpoints" / "checkpoint-2")
    assert [r["step"] for r in metrics(run)] == [1, 2]
    assert not (run / "final").exists()  # the run is not finished: no "final" model yet
    assert json.loads((run / "summary.json").read_text())["preempted_by"] == "SIGTERM"

    # Resumed (in this process), then SIGINT (Ctrl-C) in the middle of step 3.
    monkeypatch.setenv("TEST_SIGNAL_AT_CALL", "INT:1")
    previous = signal.getsignal(signal.SIGINT)
    assert main(["train", str(cfg)]) == 0
    captured = capsys.readouterr()
    assert "stopped by SIGINT at step 3 of 6" in captured.out
    assert [p.name for p in ckpt.list_complete(run / "checkpoints")] == ["checkpoint-2", "checkpoint-3"]
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert signal.getsignal(signal.SIGINT) is previous  # handlers are put back after the run

    # A second signal does not wait for the step: exit 130, the last checkpoint untouched.
    monkeypatch.setenv("TEST_SIGNAL_AT_CALL", "TERM:1;TERM:1")
    before = (run / "checkpoints" / "checkpoint-3" / "COMPLETE").read_text()
    assert main(["train", str(cfg)]) == 130
    assert [p.name for p in ckpt.list_complete(run / "checkpoints")] == ["checkpoint-2", "checkpoint-3"]
    assert (run / "checkpoints" / "checkpoint-3" / "COMPLETE").read_text() == before

    # And the run still finishes from there.
    monkeypatch.delenv("TEST_SIGNAL_AT_CALL")
    assert main(["train", str(cfg)]) == 0
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert (run / "final" / "model.safetensors").is_file()
    assert "preempted_by" not in json.loads((run / "summary.json").read_text())


def test_a_preempted_run_says_its_final_eval_was_skipped(tmp_path, tiny_model_dir, monkeypatch, capsys,
                                                        keep_threads):
    """eval.data set, SIGTERM in step 2 of 4: the checkpoint comes first, the held-out evaluation after the last
    step is skipped and the end summary says so (it never shows the before-training numbers as "after")."""
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 4},
                    eval={"data": "prompts.jsonl", "max_prompts": 2, "num_samples": 1, "threshold": 0.1})
    run = tmp_path / "run"
    # Reward calls: 1 greedy + 1 sampled for the eval before training, then one per step: SIGTERM in step 2.
    monkeypatch.setenv("TEST_SIGNAL_AT_CALL", "TERM:4")
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "stopped by SIGTERM at step 2 of 4" in out
    assert "eval        skipped after step 2 (the run stopped early)" in out and "before -> after" not in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_skipped_at_step"] == 2 and "eval_after/accuracy_greedy" not in summary
    assert "eval_before/accuracy_greedy" in summary

    monkeypatch.delenv("TEST_SIGNAL_AT_CALL")  # resumed to the end: the evaluation after step 4 happens
    assert main(["train", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "(held-out, before -> after)" in out and "skipped" not in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_after/step"] == 4 and "eval_skipped_at_step" not in summary
