"""The disk fills up in the middle of a run: while a later checkpoint or ``final/`` is written. The run
exits 2 naming the folder, the last good checkpoint stays complete, and nothing half-written is left."""

from __future__ import annotations

import errno

import pytest
import transformers.modeling_utils as hf_modeling
from safetensors import SafetensorError

from run_helpers import train, write_run
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.checkpoint.storage import as_os_error

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors' wording


def fill_disk_when(monkeypatch, marker: str, error: Exception) -> None:
    """transformers' weight writer (``save_pretrained``) raises ``error`` for paths containing ``marker``."""
    real = hf_modeling.safe_save_file

    def writer(tensors, path, *a, **k):
        if marker in str(path):
            raise error
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(hf_modeling, "safe_save_file", writer)


def assert_clean_exit_2(capsys, folder: str) -> str:
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    assert "No space left on device" in err and folder in err and "free disk space" in err, err
    return err


def test_wrapped_storage_errors_are_recognised(tmp_path):
    e = as_os_error(SafetensorError(FULL), tmp_path / "final")
    assert e.errno == errno.ENOSPC and e.filename == str(tmp_path / "final")
    e = as_os_error(OSError(errno.EDQUOT, "Disk quota exceeded", "x/.tmp-final/a"), tmp_path / "final")
    assert e.errno == errno.EDQUOT and e.filename == str(tmp_path / "final")
    assert as_os_error(SafetensorError("header too large"), tmp_path) is None
    assert as_os_error(ValueError("no"), tmp_path) is None


@pytest.mark.parametrize("error", [SafetensorError(FULL), OSError(errno.ENOSPC, "No space left on device")],
                         ids=["SafetensorError", "OSError"])
def test_disk_full_while_writing_a_later_checkpoint(tmp_path, tiny_model_dir, capsys, monkeypatch, error):
    fill_disk_when(monkeypatch, "checkpoint-2", error)  # the model's weights of checkpoint 2
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 3, "save_steps": 1})
    assert train(cfg) == 2
    assert_clean_exit_2(capsys, "checkpoint-2")
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["checkpoint-1"] and ckpt.is_valid(root / "checkpoint-1")
    assert not (tmp_path / "run" / "final").exists()


def test_disk_full_while_writing_final(tmp_path, tiny_model_dir, capsys, monkeypatch):
    fill_disk_when(monkeypatch, "final", SafetensorError(FULL))
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 2, "save_steps": 1})
    assert train(cfg) == 2
    assert_clean_exit_2(capsys, "final")
    run = tmp_path / "run"
    assert not (run / "final").exists() and not list(run.glob(".tmp-*"))  # nothing half-written
    assert ckpt.is_valid(run / "checkpoints" / "checkpoint-2")  # the last good checkpoint is intact
    monkeypatch.undo()  # space freed: the same command finishes the run and writes final/
    assert train(cfg) == 0
    assert (run / "final" / "model.safetensors").is_file() and (run / "summary.json").is_file()
