"""``slimgrpo plan`` of a config with ``memory.fit`` shows the run ``slimgrpo train`` runs; the fit
advice lists every way that keeps the task before one that changes it, offloading with the host RAM it needs
where the host budget blocks it (item 4); the plan says which memory tricks it assumed; bad budgets (bad input)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from slimgrpo.commands.cli import main
from slimgrpo.config import ConfigError, from_dict, merge_overrides
from slimgrpo.plan.search import blocked_ways, fit_to_budget
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.plan.admission import PlanScope, fitted_config, host_budget_bytes
from slimgrpo.plan.admission import admit
from slimgrpo.runspec.run import run_spec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape

# Qwen3-8B's public config (as benchmarks/planner/trace_anchors.py): not a bundled preset
QWEN3_8B = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "tie_word_embeddings": False, "max_position_embeddings": 40960,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
LONG = ["lora.enabled=true", "model.load_in_4bit=true", "model.dtype=bfloat16", "rollout.num_generations=2",
        "run.batch_size=2", "data.max_prompt_length=256", "rollout.max_completion_length=65280", "run.device=cuda"]


@pytest.fixture
def qwen3(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    return str(path)


def _shape():
    return ModelShape.from_hf_config(QWEN3_8B)


def test_plan_with_fit_plans_the_fitted_run(qwen3, capsys, monkeypatch):
    """memory.fit=true: the plan is of the offloaded run train would run (it fits), not of the config as written
    (which printed 'does not fit ... over by 12.34 GiB' and suggested memory.fit=true, already set)."""
    monkeypatch.setenv("COLUMNS", "300")
    code = main(["plan", "--model", qwen3, *LONG, "memory.fit=true", "memory.host_budget=64GiB", "--budget", "24GiB",
                 "--device", "cuda"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "`slimgrpo train` applies" in out and "memory.offload_activations=true" in out
    assert "fits in 24.00 GiB" in out and "does not fit" not in out and "(or memory.fit=true)" not in out
    assert "more than this machine's RAM" in out or "64GiB" in out


def test_fitted_config_is_what_train_runs(qwen3):
    cfg = from_dict(merge_overrides({}, [*LONG, "memory.fit=true", "memory.host_budget=null", "memory.budget=24GiB"]))
    fitted, applied = fitted_config(cfg, PlanScope(_shape(), "cuda"), 24 * 2**30, Console())
    assert "memory.offload_activations=true" in applied
    assert fitted.memory.offload_activations and fitted.memory.gradient_checkpointing
    plan = plan_memory(_shape(), run_spec(fitted, "cuda", vocab=151_936))
    assert plan.peak_bytes <= 24 * 2**30
    as_written, none = fitted_config(dataclasses_replace_fit(cfg, False), PlanScope(_shape(), "cuda"), 24 * 2**30,
                                    Console())
    assert none == [] and not as_written.memory.offload_activations


def dataclasses_replace_fit(cfg, fit):
    import dataclasses

    return dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, fit=fit))


def test_advice_keeps_the_task_first_and_names_blocked_offload():
    """13 GiB of host RAM blocks offloading (it needs ~20 GiB): the advice says what offloading would need and
    reach, and puts 8-bit AdamW before shorter completions (the old ladder shortened completions first, its gain
    too small to count)."""
    shape = _shape()
    x = run_spec(from_dict(merge_overrides({}, LONG)), "cuda", vocab=shape.vocab)
    budget, host = 24 * 2**30, 13 * 2**30
    _, steps, _ = fit_to_budget(shape, x, budget, host)
    names = [next(iter(s.change)) for s in steps]
    assert "max_completion_length" in names
    first_task_change = names.index("max_completion_length")
    assert "optimizer" in names[:first_task_change]
    blocked = blocked_ways(shape, x, budget, host, steps)
    assert len(blocked) == 1 and blocked[0].change["offload_activations"] is True
    assert blocked[0].plan_after.peak_bytes <= budget < blocked[0].plan_after.host_bytes + budget
    assert blocked[0].plan_after.host_bytes > host
    assert blocked_ways(shape, x, budget, 64 * 2**30, fit_to_budget(shape, x, budget, 64 * 2**30)[1]) == []


def test_plan_prints_blocked_offload_before_task_changes(qwen3, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    main(["plan", "--model", qwen3, *LONG, "memory.host_budget=13GiB", "--budget", "24GiB", "--device", "cuda"])
    out = capsys.readouterr().out
    blocked, shorter = out.index("not taken, host RAM: offload"), out.index("shorter completions")
    assert blocked < shorter and "this machine gives the run 13.00 GiB" in out


def test_plan_names_its_memory_tricks(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["plan", "--model", "qwen2.5-0.5b", "rollout.num_generations=8", "run.batch_size=8",
                 "data.max_prompt_length=512", "rollout.max_completion_length=8192", "--device", "cpu",
                 "model.dtype=float32", "loss.beta=0.04"]) == 0
    out = capsys.readouterr().out
    assert "memory tricks this plan assumes" in out
    assert "tiled MLP: on (memory.tiled_mlp=auto: 69,632 tokens per MLP call" in out
    assert "reference / old log-prob passes: unpadded rows" in out
    assert "gradient checkpointing: off (memory.gradient_checkpointing)" in out


def test_budget_nothing_reaches_is_refused_with_the_smallest_plan(tmp_path):
    cfg = from_dict(merge_overrides({}, ["memory.budget=1GiB", "memory.fit=true", "run.device=cpu",
                                         "model.path=qwen2.5-7b", "model.dtype=float32"]))
    with pytest.raises(MemoryBudgetError, match=r"smallest plan found is [0-9.]+ GiB with .*lora.enabled=true"):
        admit(cfg, show=False)


def test_plan_budget_nothing_reaches_prints_the_smallest_plan(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["plan", "--model", "qwen2.5-7b", "--budget", "1GiB", "--device", "cpu"]) == 4
    assert "no combination fits this budget: the smallest plan found is" in capsys.readouterr().out


def test_host_budget_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="memory.host_budget='lots'"):
        host_budget_bytes(from_dict(merge_overrides({}, ["memory.host_budget=lots"])), "cuda")
    huge = from_dict(merge_overrides({}, ["memory.host_budget=512TiB"]))
    with pytest.raises(ConfigError, match=r"memory.host_budget=512TiB .* more than this machine's RAM"):
        host_budget_bytes(huge, "cuda")
    assert host_budget_bytes(huge, "cuda", strict=False) == 512 * 2**40  # plan may plan for another machine
