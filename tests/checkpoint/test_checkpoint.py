"""Checkpoint files on their own: layout, the COMPLETE manifest, no pickle, skipping incomplete or
corrupted checkpoints, repairing an interrupted rename, pruning, the metric history."""

from __future__ import annotations

import json
import logging
import pickle
import random

import numpy as np
import pytest
import torch

from slimgrpo.checkpoint import format as ckpt
from slimgrpo.train import seeding
from slimgrpo.output.metrics import MetricsWriter


def tiny_model(hidden: int = 16):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg)


def trained_parts(hidden: int = 16):
    model = tiny_model(hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def save(out, step, parts=None, keep=10, **kw):
    model, opt, sched = parts or trained_parts()
    gen = torch.Generator().manual_seed(step)
    sampler = {"epoch": 0, "cursor": step, "size": 5, "seed": 1}
    return ckpt.save_checkpoint(out, step, ckpt.Snapshot(model, opt, sched, sampler, gen), keep=keep, **kw)


def test_layout_manifest_and_no_pickle(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (tmp_path / "config.yaml").write_text("run:\n  seed: 1\n")
    parts = trained_parts()
    path = save(tmp_path, 1, parts, extra={"nonfinite_streak": 1})
    assert path == tmp_path / "checkpoints" / "checkpoint-1"
    names = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert {"COMPLETE", "trainer_state.json", "optimizer.safetensors", "rng.safetensors", "metrics.jsonl",
            "config.yaml", "model/model.safetensors"} <= set(names)
    assert all(n.endswith((".safetensors", ".json", ".yaml", ".jsonl")) or n == "COMPLETE" for n in names), names
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["step"] == 1
    assert manifest["files"]["optimizer.safetensors"] == (path / "optimizer.safetensors").stat().st_size
    assert not list((tmp_path / "checkpoints").glob(".*"))

    def no_unpickling(*args, **kwargs):
        raise AssertionError("a checkpoint must load without unpickling")

    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(torch, "load", no_unpickling)
    model, opt, sched = trained_parts()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    gen = torch.Generator()
    random.seed(123)
    state = ckpt.load_checkpoint(path, model, opt, sched, gen)
    assert state.step == 1 and state.sampler["cursor"] == 1 and state.extra == {"nonfinite_streak": 1}
    for a, b in zip(parts[0].state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert sched.last_epoch == parts[2].last_epoch
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], parts[1].state_dict()["state"][0]["exp_avg"])
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(1).get_state())


def test_rng_states_round_trip(tmp_path):
    seeding.seed_all(7)
    gen = torch.Generator().manual_seed(3)
    tensors, plain = ckpt.rng_state(gen)
    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=gen))

    expected = draw()
    seeding.seed_all(99)
    gen.manual_seed(0)
    ckpt.restore_rng(tensors, json.loads(json.dumps(plain)), gen)  # through JSON, as on disk
    assert draw() == expected


def test_auto_resume_skips_incomplete_and_corrupted(tmp_path, caplog):
    parts = trained_parts()
    for step in (1, 2, 3, 4, 5):
        save(tmp_path, step, parts)
    root = tmp_path / "checkpoints"
    opt5 = root / "checkpoint-5" / "optimizer.safetensors"
    opt5.write_bytes(opt5.read_bytes()[:-100])  # truncated
    (root / "checkpoint-4" / "COMPLETE").unlink()  # never finished
    (root / "checkpoint-3" / "trainer_state.json").write_text("{not json")  # garbage, same size or not
    (root / ".tmp-checkpoint-6").mkdir()  # a save that was killed
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert ckpt.find_resume_checkpoint(tmp_path) == root / "checkpoint-2"
    text = caplog.text
    assert "checkpoint-5" in text and "truncated" in text
    assert "checkpoint-4" in text and "no COMPLETE marker" in text
    assert "checkpoint-3" in text
    assert "ignoring incomplete checkpoint .tmp-checkpoint-6" in text
    # A header that no longer parses is caught even when the size is unchanged.
    rng = root / "checkpoint-2" / "rng.safetensors"
    rng.write_bytes(b"\xff" * rng.stat().st_size)
    assert ckpt.find_resume_checkpoint(tmp_path) == root / "checkpoint-1"
    assert ckpt.find_resume_checkpoint(tmp_path / "nowhere") is None


def test_interrupted_rename_is_repaired(tmp_path, caplog):
    parts = trained_parts()
    root = save(tmp_path, 2, parts).parent
    # Killed after the marker was written but before the rename: the hidden copy is complete.
    (root / "checkpoint-2").rename(root / ".tmp-checkpoint-2")
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        assert ckpt.find_resume_checkpoint(tmp_path) == root / "checkpoint-2"
    assert "recovered checkpoint-2 from .tmp-checkpoint-2" in caplog.text
    # Re-saving a step moves the old copy aside first; killed between the two renames, the old copy is
    # the one that comes back.
    (root / "checkpoint-2").rename(root / ".old-checkpoint-2")
    assert ckpt.find_resume_checkpoint(tmp_path) == root / "checkpoint-2"
    # A hidden copy without a marker is never promoted.
    (root / "checkpoint-2" / "COMPLETE").unlink()
    (root / "checkpoint-2").rename(root / ".tmp-checkpoint-2")
    assert ckpt.find_resume_checkpoint(tmp_path) is None


def test_resaving_a_step_replaces_it_and_pruning_keeps_the_newest(tmp_path, caplog):
    parts = trained_parts()
    for step in (1, 2, 3, 4):
        save(tmp_path, step, parts, keep=2)
    root = tmp_path / "checkpoints"
    assert [p.name for p in ckpt.list_complete(root)] == ["checkpoint-3", "checkpoint-4"]
    save(tmp_path, 4, parts, keep=2)  # same step again (e.g. resumed at the last step)
    assert [p.name for p in ckpt.list_complete(root)] == ["checkpoint-3", "checkpoint-4"]
    assert ckpt.is_valid(root / "checkpoint-4") and not list(root.glob(".*"))
    # Saving an earlier step means the run went back to an older checkpoint: the later ones belong to
    # an abandoned continuation and go, so resume=auto cannot jump onto it.
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        save(tmp_path, 2, parts, keep=2)
    assert [p.name for p in ckpt.list_complete(root)] == ["checkpoint-2"]
    assert "removing checkpoint-3" in caplog.text


def test_loading_into_another_model_says_what_to_do(tmp_path):
    path = save(tmp_path, 1)
    model, opt, sched = trained_parts(hidden=24)
    with pytest.raises(ckpt.CheckpointError, match="saved from a different model.*model.path"):
        ckpt.load_checkpoint(path, model, opt, sched, None)


def test_metrics_truncated_to_the_checkpoint_on_resume(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        writer.log(step, {"loss": float(step)})
    saved = tmp_path / "saved.jsonl"
    saved.write_text((tmp_path / "metrics.jsonl").read_text())
    writer.log(4, {"loss": 4.0})
    with writer.path.open("a") as f:
        f.write('{"step": 5, "lo')  # killed in the middle of a line
    writer.truncate_after(3)
    assert [r["step"] for r in writer.history()] == [1, 2, 3]
    writer.path.write_text('{"step": 1, "loss": 9.0}\n')  # the live file lost lines: the saved copy wins
    writer.truncate_after(2, saved_history=saved)
    assert [(r["step"], r["loss"]) for r in writer.history()] == [(1, 1.0), (2, 2.0)]


def test_another_thread_count_is_warned_about(tmp_path, caplog):
    path = save(tmp_path, 1)
    state_file = path / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["num_threads"] = torch.get_num_threads() + 3
    state_file.write_text(json.dumps(state))
    model, opt, sched = trained_parts()
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        loaded = ckpt.load_checkpoint(path, model, opt, sched, None)
    assert loaded.num_threads == torch.get_num_threads() + 3
    assert f"Set run.num_threads={loaded.num_threads} for a bit-identical continuation" in caplog.text
