"""``slimgrpo plan --longest``: the longest prompt-heavy and completion-heavy context that fits a budget, with
memory.fit's changes (plan/longest.py), on a tiny shape (fast); and confirmed by trace."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slimgrpo.commands.cli import main
from slimgrpo.plan.longest import fitted, longest_context, with_length
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape

pytestmark = pytest.mark.usefixtures("one_thread")

# A tiny Llama (hidden 64, MLP 176, 2 layers, 1,000-token untied head) with a 6,000-position window
SHAPE = ModelShape("llama", hidden=64, intermediate=176, layers=2, heads=4, kv_heads=2, vocab=1000, tie=False,
                   max_positions=6000)
INPUTS = RunSpec(device="cuda", lora=True, num_generations=2, micro_batch_rows=2, max_prompt_length=37,
                    max_completion_length=101, token_chunk=128, framework_overhead_bytes=0)


@pytest.mark.parametrize("kind", ["prompt-heavy", "completion-heavy"])
def test_the_answer_fits_and_one_token_more_does_not(kind):
    budget = plan_memory(SHAPE, with_length(INPUTS, kind, 500)).peak_bytes  # fits 500 tokens as configured
    found = longest_context(SHAPE, INPUTS, budget, kind)
    assert found.fits and not found.at_limit and found.limit == 6000
    assert found.plan.peak_bytes <= budget
    other = found.completion if kind == "prompt-heavy" else found.prompt
    assert other == (101 if kind == "prompt-heavy" else 37)  # the short part is the config's
    assert found.long_part > 1000  # memory.fit's changes (checkpointing, ...) make it longer
    assert found.changes  # and the answer names them
    assert not fitted(SHAPE, with_length(INPUTS, kind, found.long_part + 1), budget)[0]
    again = fitted(SHAPE, dataclasses.replace(with_length(INPUTS, kind, found.long_part), **found.changes), budget)
    assert again[0]  # the changes it names make the answer fit as they are


def test_the_whole_window_and_nothing():
    found = longest_context(SHAPE, INPUTS, 1 << 40, "completion-heavy")
    assert found.fits and found.at_limit and found.tokens == 6000 and found.prompt == 37
    nothing = longest_context(SHAPE, INPUTS, 1 << 10, "prompt-heavy")
    assert not nothing.fits
    with pytest.raises(ValueError, match="position limit"):
        longest_context(SHAPE, dataclasses.replace(INPUTS, max_completion_length=6000), 1 << 40, "prompt-heavy")


def test_shorter_completions_are_never_the_fit():
    """memory.fit may halve max_completion_length as its last rung; --longest never does (it changes the task)."""
    budget = plan_memory(SHAPE, with_length(INPUTS, "completion-heavy", 800)).peak_bytes
    found = longest_context(SHAPE, INPUTS, budget, "completion-heavy")
    assert "max_completion_length" not in found.changes


def _config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "tie_word_embeddings": False, "max_position_embeddings": 1024,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}}))
    return path


@pytest.mark.slow  # the search traced end to end (45 s on 2 cores); the fast tests cover its parts
def test_cli_longest_with_trace(tmp_path, capsys):
    """The CLI on a config.json whose YaRN scaling stretches 1,024 positions to 4,096, on CUDA in 530 MiB (18 MiB
    over the CUDA context): both shapes, the changes memory.fit made, a trace at each answer against the budget,
    and 5% above the answer where that is below the window."""
    args = ["plan", "--model", str(_config_json(tmp_path)), "--device", "cuda", "--budget", "530MiB", "--longest",
            "--trace", "lora.enabled=true", "rollout.num_generations=2", "run.batch_size=2",
            "data.max_prompt_length=37", "rollout.max_completion_length=101", "loss.token_chunk=128", "loss.beta=0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "position limit 4,096 after rope scaling" in out and "10% of the tensor peak" in out
    lines = {kind: next(ln for ln in out.splitlines() if ln.strip().startswith(kind))
             for kind in ("prompt-heavy", "completion-heavy")}
    assert "+ completion 101 =" in lines["prompt-heavy"] and "whole window" not in lines["prompt-heavy"]
    assert "prompt 37 +" in lines["completion-heavy"]
    assert "memory.gradient_checkpointing=true" in lines["prompt-heavy"]
    traced = [ln for ln in out.splitlines() if "trace at the answer" in ln]
    assert len(traced) == 2 and all("trace / plan" in ln and " in 0.52 GiB" in ln for ln in traced), traced
    assert "trace 5% longer (data.max_prompt_length=" in out


def test_cli_longest_needs_a_budget_and_says_when_nothing_fits(tmp_path, capsys):
    assert main(["plan", "--model", str(_config_json(tmp_path)), "--device", "cuda", "--longest"]) == 2
    assert "needs a budget" in capsys.readouterr().err
    assert main(["plan", "--model", str(_config_json(tmp_path)), "--device", "cuda", "--longest",
                 "--budget", "100MiB"]) == 4
    out = capsys.readouterr().out
    assert "nothing fits, not even a 1-token prompt" in out and "not even a 1-token completion" in out


@pytest.mark.parametrize("kind,margin", [("completion-heavy", 0.0), ("prompt-heavy", 0.10)])
def test_smallest_budget_for_the_whole_window(kind, margin):
    """The least budget (a multiple of the step) at which the whole window fits with memory.fit's changes, leaving
    the CUDA allocator margin; one step less does not fit."""
    from slimgrpo.plan.longest import smallest_budget

    step = 1 << 16
    got = smallest_budget(SHAPE, INPUTS, kind, margin=margin, step=step)
    assert got.budget % step == 0 and got.found.fits and got.found.at_limit and got.found.tokens == 6000
    overhead = got.found.plan.framework_bytes
    assert overhead + (got.found.plan.peak_bytes - overhead) * (1 + margin) <= got.budget  # margin left free

    def target(budget):  # the plan's share of a device budget, as `plan --longest` searches it
        return int((budget - overhead) / (1 + margin)) + overhead

    full = with_length(INPUTS, kind, got.found.long_part)
    assert fitted(SHAPE, full, target(got.budget))[0]
    assert not fitted(SHAPE, full, target(got.budget - step))[0]
    assert got.found.changes  # it takes memory.fit's changes to get there
    shorter = smallest_budget(SHAPE, INPUTS, kind, length=1000, margin=margin, step=step)
    assert shorter.budget < got.budget and shorter.found.long_part >= 1000
    with pytest.raises(ValueError, match="position limit"):
        smallest_budget(SHAPE, INPUTS, kind, length=6000)
