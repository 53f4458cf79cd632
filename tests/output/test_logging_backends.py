"""log.report_to backends: name parsing, missing-package errors, TensorBoard end to end.

wandb, mlflow and trackio are never started here (they could reach the network); only their
missing-package path is exercised, by hiding the package from the import system.
"""

from __future__ import annotations

import sys

import pytest

from slimgrpo.output.backends import BackendUnavailable, make_backends, parse_report_to, scalars


def test_parse_report_to():
    assert parse_report_to("none") == []
    assert parse_report_to(None) == []
    assert parse_report_to([]) == []
    assert parse_report_to("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert parse_report_to(["none", "MLflow", "mlflow"]) == ["mlflow"]
    with pytest.raises(ValueError, match="Did you mean 'tensorboard'"):
        parse_report_to(["tensorbord"])
    with pytest.raises(ValueError, match="Choose from tensorboard, wandb, trackio, mlflow, none"):
        parse_report_to("comet")


def test_none_makes_no_backends(tmp_path):
    assert make_backends("none", tmp_path, {}) == []


@pytest.mark.parametrize("name", ["wandb", "mlflow", "trackio", "tensorboard"])
def test_missing_package_names_the_pip_extra(name, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail as if not installed
    with pytest.raises(BackendUnavailable, match=rf"pip install 'slimgrpo\[{name}\]'") as info:
        make_backends(["none", name], tmp_path, {"loss": {"beta": 0.0}})
    assert isinstance(info.value, ValueError)  # the CLI shows it as a one-line user error
    assert not (tmp_path / "tensorboard").exists()


def test_missing_package_fails_before_any_backend_starts(monkeypatch, tmp_path):
    pytest.importorskip("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(BackendUnavailable):
        make_backends(["tensorboard", "wandb"], tmp_path, {})
    assert not (tmp_path / "tensorboard").exists()


def test_scalars_drop_nulls_and_non_numbers():
    rec = {"step": 3, "reward": 0.5, "kl": None, "update_skipped": True, "note": "x", "loss": float("nan")}
    assert scalars(rec) == {"reward": 0.5, "update_skipped": 1.0}


def test_tensorboard_backend_writes_scalars_text_and_no_secrets(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    secret = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"
    monkeypatch.setenv("HF_TOKEN", secret)
    config = {"model": {"path": "tiny", "hub_token": "plain-secret-value"}, "note": f"uses {secret}"}
    (backend,) = make_backends("tensorboard", tmp_path, config)
    for step in (1, 2, 3):
        backend.log(step, {"step": step, "reward": 0.1 * step, "rewards/acc/mean": 0.2, "kl": None if step == 2 else 0.01})
    backend.log_completions(3, [{"step": 3, "prompt": [{"role": "user", "content": "2|3?"}],
                                 "completion": f"<think>ok</think> token {secret}", "reward": 1.0, "advantage": 0.5}])
    backend.close()

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3]
    assert acc.Scalars("reward")[2].value == pytest.approx(0.3)
    assert [e.step for e in acc.Scalars("kl")] == [1, 3]  # null steps are gaps, not zeros
    assert "rewards/acc/mean" in acc.Tags()["scalars"]

    raw = b"".join(p.read_bytes() for p in (tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert secret.encode() not in raw and b"plain-secret-value" not in raw
    assert b"<think>ok</think>" in raw and b"user: 2\\|3?" in raw  # completions table, pipe escaped
