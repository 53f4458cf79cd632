"""Host RAM on CUDA (and bad input): the plan and memory.fit know the host RAM a run may use
(``memory.host_budget``: ``auto`` = the machine's MemAvailable, or a size); a run whose offloaded checkpoints
or reference copy would not fit is refused before it starts, with both numbers."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml

from slimgrpo.config import from_dict, load_config, merge_overrides
from slimgrpo.plan.search import fit_to_budget
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.plan.admission import admit
from slimgrpo.plan.admission import host_budget_bytes
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import load_shape

OFFLOADED = ["model.dtype=bfloat16", "lora.enabled=true", "memory.gradient_checkpointing=true",
             "memory.offload_activations=true", "rollout.num_generations=8", "run.batch_size=8",
             "data.max_prompt_length=512", "rollout.max_completion_length=16384"]


def test_host_budget_is_read_or_given():
    cfg = from_dict(merge_overrides({}, []))
    assert cfg.memory.host_budget == "auto"
    assert host_budget_bytes(cfg, "cuda") > 0  # this machine's MemAvailable
    assert host_budget_bytes(cfg, "cpu") is None  # host memory is the device: the budget covers it
    assert host_budget_bytes(from_dict(merge_overrides({}, ["memory.host_budget=3GiB"])), "cuda") == 3 * 2**30
    assert host_budget_bytes(from_dict(merge_overrides({}, ["memory.host_budget=null"])), "cuda") is None


def test_plan_refuses_offload_past_the_host_budget(capsys, monkeypatch):
    from slimgrpo.commands.cli import main

    monkeypatch.setenv("COLUMNS", "300")
    def args(host):
        return ["plan", "--model", "llama-3.1-8b", *OFFLOADED, f"memory.host_budget={host}", "--device", "cuda"]

    assert main(args("1TiB")) == 0
    out = capsys.readouterr().out
    assert "host RAM: the plan holds" in out and "1,024.00 GiB available" in out
    assert main(args("4GiB")) == 4
    out = capsys.readouterr().out
    assert "does not fit in host RAM" in out and "4.00 GiB of memory.host_budget=4GiB" in out
    assert "offloaded checkpoints" in out and "memory.offload_activations off" in out


def test_fit_does_not_offload_past_the_host_budget():
    shape = load_shape("llama-3.1-8b")
    x = RunSpec(device="cuda", lora=True, gradient_checkpointing=True, num_generations=8,
                   max_completion_length=16384, max_prompt_length=512)
    budget = int(0.8 * plan_memory(shape, x).peak_bytes)
    _, free, _ = fit_to_budget(shape, x, budget)
    assert any(s.change.get("offload_activations") for s in free)
    _, tight, _ = fit_to_budget(shape, x, budget, host_budget=2**30)
    assert not any(s.change.get("offload_activations") for s in tight)
    assert all(s.plan_after.host_bytes <= 2**30 for s in tight)


def test_train_refuses_before_loading_weights(tmp_path, tiny_model_dir, capsys):
    """Full fine-tuning with beta > 0 on CUDA keeps the reference copy in host RAM; 1 KiB cannot hold it. The
    model folder has no weights: the refusal comes first (exit 4, both numbers)."""
    from run_helpers import train

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"path": str(model)}, "data": {"path": "p.jsonl", "max_prompt_length": 16},
        "rewards": {"functions": ["length"]}, "rollout": {"num_generations": 2, "max_completion_length": 8},
        "loss": {"beta": 0.04}, "memory": {"host_budget": "1KiB"},
        "run": {"batch_size": 2, "device": "cuda", "max_steps": 1, "output_dir": str(tmp_path / "run")}}))
    with pytest.raises(MemoryBudgetError, match=r"reference policy .* more than the 0.00 GiB of memory.host_budget=1KiB"):
        admit(load_config(path), show=False)
    assert train(path) == 4
    err = capsys.readouterr()
    text = err.out + err.err
    assert "host RAM" in text and "memory.host_budget=1KiB" in text and "no weights" not in text


def test_a_cpu_run_is_not_checked_against_host_budget(tmp_path, tiny_model_dir):
    cfg = from_dict(merge_overrides({}, [f"model.path={tiny_model_dir}", "run.device=cpu", "loss.beta=0.04",
                                         "memory.host_budget=1KiB", "data.max_prompt_length=16",
                                         "rollout.max_completion_length=8"]))
    admit(cfg, show=False)  # the reference copy is in the RSS the device budget covers
    assert dataclasses.is_dataclass(cfg)
