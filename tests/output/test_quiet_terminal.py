"""The terminal of a run shows slimgrpo's own lines: transformers' progress bars ("Loading weights",
"Writing model shards"), torch/torchao import warnings and FutureWarnings come back only with
log.verbose=true. Runs in fresh processes: the silencing is process-wide."""

from __future__ import annotations

import pytest
import yaml

from run_helpers import cli
from slimgrpo.demo import MODEL_DIR, TRAIN_FILE

THIRD_PARTY = ("Writing model shards", "Loading weights", "FutureWarning", "Failed to load", "_pytree.py")


def demo_model_config(tmp_path) -> str:
    cfg = {
        "model": {"path": str(MODEL_DIR), "dtype": "float32"},
        "data": {"path": str(TRAIN_FILE), "max_prompt_length": 16},
        "rollout": {"num_generations": 4, "max_completion_length": 6},
        "rewards": {"functions": ["slimgrpo.demo.task:demo_accuracy"]},
        "run": {"max_steps": 1, "batch_size": 8, "device": "cpu", "output_dir": str(tmp_path / "run")},
        "log": {"progress": False},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return str(tmp_path / "cfg.yaml")


def test_train_is_quiet_by_default_and_verbose_brings_the_bars_back(tmp_path):
    quiet = cli("train", demo_model_config(tmp_path))
    assert quiet.returncode == 0, quiet.stderr
    assert not [s for s in THIRD_PARTY if s in quiet.stderr], quiet.stderr
    assert "done: 1 steps" in quiet.stdout and (tmp_path / "run" / "final").is_dir()

    loud = cli("train", demo_model_config(tmp_path), "log.verbose=true", "run.output_dir=" + str(tmp_path / "loud"))
    assert loud.returncode == 0, loud.stderr
    assert "Writing model shards" in loud.stderr  # the final model's save, shown by transformers


@pytest.mark.slow  # the train run above covers the shared code; the tools demo adds its own (16 s)
def test_tool_demo_is_quiet_by_default(tmp_path):
    from slimgrpo.commands.demo_tools import TOOLS_DIR

    if not (TOOLS_DIR / "model" / "model.safetensors").exists():
        pytest.skip("tool demo assets not built")
    run = cli("demo", "--task", "tools", "--output-dir", str(tmp_path / "run"), "run.max_steps=1")
    assert run.returncode == 0, run.stderr
    assert not [s for s in THIRD_PARTY if s in run.stderr], run.stderr


@pytest.mark.slow  # a LoRA run, then its export (30 s on 2 cores)
def test_export_of_a_lora_run_is_quiet_unless_verbose(tmp_path):
    trained = cli("train", demo_model_config(tmp_path), "lora.enabled=true", "lora.r=4")
    assert trained.returncode == 0, trained.stderr
    quiet = cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "merged"))
    assert quiet.returncode == 0, quiet.stderr
    assert not [s for s in THIRD_PARTY if s in quiet.stderr], quiet.stderr
    loud = cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "merged-loud"), "--verbose")
    assert loud.returncode == 0 and "Loading weights" in loud.stderr, loud.stderr


# The two tests below run in this order in one process: the first quiets the process as a training run does,
# the second reads a third party's WARNING through caplog (conftest's _undo_quiet_third_party restores it).
def test_quieting_in_process_filters_third_party_warnings():
    import logging

    from slimgrpo.output.console import quiet_third_party

    quiet_third_party(verbose=False)
    assert logging.getLogger("peft").level == logging.ERROR


def test_caplog_sees_third_party_warnings_after_a_test_that_quieted(caplog):
    import logging

    # peft logs through the root's handlers (transformers' own logger does not propagate once configured)
    assert logging.getLogger("peft").propagate
    with caplog.at_level(logging.WARNING):
        logging.getLogger("peft.tuners").warning("a third-party warning")
    assert "a third-party warning" in caplog.text


@pytest.fixture(scope="module")
def quieted_by_a_module_fixture():
    """A module-scoped fixture that runs a command in process quiets before the test's own fixtures start."""
    from slimgrpo.output.console import quiet_third_party

    quiet_third_party(verbose=False)


def test_caplog_sees_third_party_warnings_after_a_module_fixture_quieted(quieted_by_a_module_fixture, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        logging.getLogger("peft.tuners").warning("a warning after the module fixture")
    assert "a warning after the module fixture" in caplog.text
