"""Exact resume on CPU: a run killed with SIGKILL at several points (in the middle of a step, in the middle
of writing a checkpoint, between finishing a checkpoint and renaming it into place) and resumed each time
ends with the same bits as a run that was never interrupted: weights, optimizer state, RNG states and every
logged number."""

from __future__ import annotations

import json
import signal

import torch
from safetensors.torch import load_file

from run_helpers import cli, numeric_metrics, start_cli, write_run
from slimgrpo.config import load_config
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.train.runner import run_training

KILLED = -signal.SIGKILL


def _same_tensors(a, b) -> list[str]:
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return [k for k in ta if not torch.equal(ta[k], tb[k])]


def test_sigkill_anywhere_then_resume_is_bit_identical(tmp_path, tiny_model_dir):
    # 6 steps, a checkpoint every 2, sampling with the full set of numerics: warmup + cosine schedule,
    # KL to the reference, two optimizer iterations per batch, an epoch boundary inside a batch.
    sections = dict(run={"max_steps": 6, "save_steps": 2, "save_total_limit": 2},
                    loss={"beta": 0.04, "num_iterations": 2})
    ref_cfg = write_run(tmp_path / "ref", tiny_model_dir, **sections)
    cfg = write_run(tmp_path / "killed", tiny_model_dir, **sections)
    run, ckpts = tmp_path / "killed" / "run", tmp_path / "killed" / "run" / "checkpoints"
    reference = start_cli("train", str(ref_cfg))  # the uninterrupted run, alongside

    # 1. Killed while saving step 4, right after the optimizer file: only a temporary folder is left.
    out = cli("train", str(cfg), env={"SLIMGRPO_DEBUG_KILL_IN_SAVE": "optimizer@4"})
    assert out.returncode == KILLED, out.stderr
    assert [p.name for p in ckpt.list_complete(ckpts)] == ["checkpoint-2"]
    assert (ckpts / ".tmp-checkpoint-4" / "optimizer.safetensors").is_file()
    assert not (ckpts / ".tmp-checkpoint-4" / ckpt.MARKER).exists()
    assert [r["step"] for r in numeric_metrics(run)] == [1, 2, 3, 4]

    # 2. Resumes from step 2 (ignoring the half-written folder), killed after the marker of step 4 was
    # written but before the folder was renamed into place.
    out = cli("train", str(cfg), env={"SLIMGRPO_DEBUG_KILL_IN_SAVE": "marker@4"})
    assert out.returncode == KILLED, out.stderr
    assert "ignoring incomplete checkpoint .tmp-checkpoint-4" in out.stderr
    assert "resumed from" in out.stderr and "checkpoint-2 at step 2" in out.stderr
    assert (ckpts / ".tmp-checkpoint-4" / ckpt.MARKER).is_file() and not (ckpts / "checkpoint-4").exists()

    # 3. The finished-but-unrenamed checkpoint is recovered; killed in the middle of step 6 (its reward
    # call), after step 5 was logged but not checkpointed.
    out = cli("train", str(cfg), env={"TEST_SIGNAL_AT_CALL": "KILL:2"})
    assert out.returncode == KILLED, out.stderr
    assert "recovered checkpoint-4" in out.stderr and "checkpoint-4 at step 4" in out.stderr
    assert [r["step"] for r in numeric_metrics(run)] == [1, 2, 3, 4, 5]

    # 4. Resumes from step 4 and finishes.
    out = cli("train", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "checkpoint-4 at step 4" in out.stderr

    stdout, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr
    ref = tmp_path / "ref" / "run"
    assert _same_tensors(ref / "final" / "model.safetensors", run / "final" / "model.safetensors") == []
    a, b = ref / "checkpoints" / "checkpoint-6", ckpts / "checkpoint-6"
    assert _same_tensors(a / "optimizer.safetensors", b / "optimizer.safetensors") == []  # AdamW moments + steps
    assert _same_tensors(a / "rng.safetensors", b / "rng.safetensors") == []  # torch + sampling generator
    state_a, state_b = (json.loads((p / "trainer_state.json").read_text()) for p in (a, b))
    assert state_a == state_b  # scheduler, data position, Python/NumPy RNG, counters
    # Every logged number (rewards, loss, KL, grad norm, lr, lengths) matches; only timings differ.
    assert numeric_metrics(run) == numeric_metrics(ref)
    assert [r["step"] for r in numeric_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert (b / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()  # history in the checkpoint
    assert [p.name for p in ckpt.list_complete(ckpts)] == ["checkpoint-4", "checkpoint-6"]  # keep the last 2
    assert not list(ckpts.glob(".*"))  # no temporary folders left behind


def test_lora_with_dropout_resumes_exactly_in_process(tmp_path, tiny_model_dir):
    """LoRA dropout draws from the global torch RNG, the adapter is saved alone: stopping after step 2
    and resuming gives the same adapter as running 3 steps straight."""
    sections = dict(lora={"enabled": True, "r": 4, "dropout": 0.1}, run={"max_steps": 3, "save_steps": 1},
                    loss={"beta": 0.0})
    straight = load_config(write_run(tmp_path / "a", tiny_model_dir, **sections))
    stopped = load_config(write_run(tmp_path / "b", tiny_model_dir, **sections))
    threads = torch.get_num_threads()
    try:
        run_training(straight)
        run_training(stopped, callbacks=[lambda trainer, step, metrics: step == 2])
        assert json.loads((tmp_path / "b" / "run" / "summary.json").read_text())["steps"] == 2
        run_training(stopped)
    finally:
        torch.set_num_threads(threads)  # the runs set run.num_threads=1 for this process
    a = tmp_path / "a" / "run" / "final" / "adapter_model.safetensors"
    b = tmp_path / "b" / "run" / "final" / "adapter_model.safetensors"
    assert _same_tensors(a, b) == []
    assert numeric_metrics(tmp_path / "a" / "run") == numeric_metrics(tmp_path / "b" / "run")
