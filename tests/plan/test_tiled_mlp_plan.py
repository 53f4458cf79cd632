"""memory.tiled_mlp in the plan, the trace, memory.fit and the run (memory/tiled_mlp.py is checked against
the untiled MLP in tests/memory/test_tiled_mlp.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scaled_llama import BASE, SHAPE  # a scaled-down Llama (hidden 256, MLP 688), 37 + 3,001 tokens a row

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.plan.search import fit_to_budget
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.plan.admission import admission_of, overrides_for
from slimgrpo.train.build import apply_tiled_mlp
from slimgrpo.runspec.run import run_spec
from slimgrpo.plan.model import TILED_MLP_AUTO_TOKENS, plan_memory, tiled_mlp_on
from slimgrpo.runspec.run import RunSpec
from slimgrpo.forward.costs import mlp_bytes_per_token, norm_backward_bytes_per_token, update_layer_bytes
from slimgrpo.memory.tiled_mlp import tiled_shard_tokens
from slimgrpo.runspec.shape import ModelShape

pytestmark = pytest.mark.usefixtures("one_thread")

QWEN3_8B = ModelShape("qwen3", hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, vocab=151_936,
                      tie=False, max_positions=131_072, head_dim=128)


def _config(*extra):
    return from_dict(merge_overrides({}, BASE + list(extra)))


@pytest.mark.parametrize("setting", ["lora", "full"])
def test_trace_of_the_tiled_update_agrees_with_the_plan(setting):
    """On the CUDA trace path the tiled update's tensor peak is within 10% of the plan's, and both are well
    below the untiled ones (3,038 tokens per MLP call: 12 shards of 254 tokens)."""
    from slimgrpo.plan.admission import trace_config
    from slimgrpo.plan.render import plan_tensor_bytes

    # full: bf16 weights stepped plainly, so the fixed bytes are the ones the 0.85 was set against (the default
    # float32 master copy adds the same bytes with and without tiling: tests/update/test_precision.py counts it)
    extra = [] if setting == "lora" else ["lora.enabled=false", "memory.bf16_update=plain"]
    peaks = {}
    for tiled in ("off", "on"):
        cfg = _config(*extra, f"memory.tiled_mlp={tiled}")
        plan = plan_memory(SHAPE, run_spec(cfg, "cuda", vocab=SHAPE.vocab))
        trace = trace_config(cfg, SHAPE, device="cuda", generation=False)
        peaks[tiled] = plan_tensor_bytes(plan, "update"), trace.phases["update"].peak_bytes
        assert any("tiled MLP" in n for n in trace.notes) == (tiled == "on")
    (plan_off, trace_off), (plan_on, trace_on) = peaks["off"], peaks["on"]
    assert 0.9 <= trace_on / plan_on <= 1.1, (trace_on, plan_on)
    assert trace_on < 0.85 * trace_off and plan_on < 0.85 * plan_off, peaks


def test_plan_counts_one_shard():
    x = RunSpec(device="cuda", lora=True, load_in_4bit=True, gradient_checkpointing=True, micro_batch_rows=1,
                   num_generations=2, generation_batch_rows=1, max_prompt_length=256,
                   max_completion_length=100_000)
    off = plan_memory(QWEN3_8B, dataclasses.replace(x, tiled_mlp="off"))
    on = plan_memory(QWEN3_8B, dataclasses.replace(x, tiled_mlp="on"))
    k = tiled_shard_tokens(100_256, 4096)
    buffers = 3 * 100_256 * 4096 * 2  # the whole call's H-wide gradient buffers (TILED_MLP_BACKWARD_BUFFERS)
    shard = math.ceil(1.5 * k * mlp_bytes_per_token(QWEN3_8B, x)) + buffers
    # The shard runs at another moment of the layer's backward than the RMSNorm's fp32 workspace; the plan
    # adds only what exceeds that workspace, and for QLoRA (a small layer) the norm's is the larger.
    x_on, x_off = dataclasses.replace(x, tiled_mlp="on"), dataclasses.replace(x, tiled_mlp="off")
    layer_on = update_layer_bytes(QWEN3_8B, x_on)[0]
    workspace = max(math.ceil(0.5 * layer_on), 100_256 * norm_backward_bytes_per_token(QWEN3_8B, x_on, 100_256))
    assert k == 4011 and on.bytes_of("tiled MLP shard") == max(0, shard - workspace) == 0  # 25 shards
    assert workspace > shard
    saved = off.bytes_of("recompute working set") - on.bytes_of("recompute working set")
    layer_off = update_layer_bytes(QWEN3_8B, x_off)[0]
    workspace_off = max(math.ceil(0.5 * layer_off), 100_256 * norm_backward_bytes_per_token(QWEN3_8B, x_off, 100_256))
    assert layer_off - layer_on == 100_256 * (mlp_bytes_per_token(QWEN3_8B, x) - 2 * 4096)  # the MLP's, less its input
    assert saved == (layer_off + workspace_off) - (layer_on + workspace) > 8 * 2**30
    assert on.peak_bytes < 0.9 * off.peak_bytes  # 0.85: the MLP is most of the untiled recompute working set
    assert "tiled MLP shard" not in [c.name for c in off.components]


def test_auto_is_off_for_short_micro_batches_and_on_for_long_ones():
    short = RunSpec(device="cuda", lora=True, gradient_checkpointing=True, micro_batch_rows=1, num_generations=2,
                       max_prompt_length=256, max_completion_length=4096, tiled_mlp="auto")
    assert not tiled_mlp_on(QWEN3_8B, short)
    assert plan_memory(QWEN3_8B, short).peak_bytes == plan_memory(
        QWEN3_8B, dataclasses.replace(short, tiled_mlp="off")).peak_bytes
    long = dataclasses.replace(short, max_completion_length=TILED_MLP_AUTO_TOKENS)
    assert tiled_mlp_on(QWEN3_8B, long)
    plan = plan_memory(QWEN3_8B, long)
    assert plan.inputs.tiled_mlp == "auto" and any("tiled_mlp=auto: on" in n for n in plan.notes)
    assert plan.peak_bytes == plan_memory(QWEN3_8B, dataclasses.replace(long, tiled_mlp="on")).peak_bytes


def test_config_values():
    assert from_dict({}).memory.tiled_mlp == "auto"
    assert run_spec(_config("memory.tiled_mlp=on"), "cuda").tiled_mlp == "on"
    assert run_spec(_config("memory.tiled_mlp=false"), "cuda").tiled_mlp == "off"
    assert run_spec(from_dict({"memory": {"tiled_mlp": True}}), "cuda").tiled_mlp == "on"
    from slimgrpo.config import ConfigError

    with pytest.raises(ConfigError, match="tiled_mlp"):
        from_dict({"memory": {"tiled_mlp": "sometimes"}})


def test_fit_turns_the_tiled_mlp_on():
    """Qwen3-8B QLoRA, one row of 256 + 32,000 tokens (below auto's 65,536), 24 GB, no host RAM to offload to:
    memory.fit's ladder reaches the tiled MLP."""
    x = RunSpec(device="cuda", lora=True, load_in_4bit=True, gradient_checkpointing=True, micro_batch_rows=1,
                   num_generations=2, generation_batch_rows=1, max_prompt_length=256, max_completion_length=32_000,
                   tiled_mlp="auto")
    assert not tiled_mlp_on(QWEN3_8B, x)
    fitted, steps, fits = fit_to_budget(QWEN3_8B, x, 24 * 10**9, host_budget=0)
    assert fits and fitted.tiled_mlp == "on" and fitted.max_completion_length == 32_000
    assert "memory.tiled_mlp=on" in overrides_for(steps[-1].change)


def _tiny_llama():
    from slimgrpo.trace.synthetic import random_causal_lm

    return random_causal_lm(SHAPE, torch.float32, "cpu")


def test_run_tiles_where_the_plan_says():
    cfg = _config("memory.tiled_mlp=on")
    plan = plan_memory(SHAPE, run_spec(cfg, "cuda", vocab=SHAPE.vocab))
    model = _tiny_llama()
    assert apply_tiled_mlp(model, admission_of(cfg, plan))
    from slimgrpo.memory.tiled_mlp import is_tiled

    assert all(is_tiled(layer.mlp) for layer in model.model.layers)
    off = _config("memory.tiled_mlp=off")
    model = _tiny_llama()
    assert not apply_tiled_mlp(model, admission_of(off, plan_memory(SHAPE, run_spec(off, "cuda", vocab=SHAPE.vocab))))
    assert not any(is_tiled(layer.mlp) for layer in model.model.layers)
    assert not apply_tiled_mlp(_tiny_llama(), admission_of(cfg, plan), distributed=True, show=False)


class OtherMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.inner = mlp

    def forward(self, x):
        return self.inner(x)


def test_an_unknown_mlp_runs_untiled_only_if_the_untiled_plan_fits():
    from rich.console import Console

    from slimgrpo.memory.tiled_mlp import is_tiled

    def model_with_unknown():
        model = _tiny_llama()
        model.model.layers[2].mlp = OtherMLP(model.model.layers[2].mlp)
        return model

    roomy = _config("memory.tiled_mlp=on", "memory.budget=100GiB")
    plan = plan_memory(SHAPE, run_spec(roomy, "cuda", vocab=SHAPE.vocab))
    console = Console(record=True, width=300)
    model = model_with_unknown()
    assert not apply_tiled_mlp(model, admission_of(roomy, plan), console=console)
    text = console.export_text()
    assert "cannot tile OtherMLP" in text and "goes on untiled" in text and "fits memory.budget=100GiB" in text
    assert not any(is_tiled(m) for m in model.modules())
    untiled = plan_memory(SHAPE, run_spec(_config("memory.tiled_mlp=off"), "cuda", vocab=SHAPE.vocab))
    between = (plan.peak_bytes + untiled.peak_bytes) // 2  # the tiled plan fits, the untiled one does not
    tight = _config("memory.tiled_mlp=on", f"memory.budget={between}B")
    with pytest.raises(MemoryBudgetError) as err:
        apply_tiled_mlp(model_with_unknown(), admission_of(tight, plan), console=console)
    assert err.value.exit_code == 4
    message = str(err.value)
    assert "OtherMLP" in message and f"{untiled.peak_bytes / 2**30:,.2f} GiB" in message
    assert f"{plan.peak_bytes / 2**30:,.2f} GiB" in message


def test_a_run_with_the_tiled_mlp_trains_as_the_untiled_one(tmp_path, tiny_model_dir):
    """``slimgrpo train`` with memory.tiled_mlp=on (hidden 32; 8 rows of up to 40 tokens in one micro-batch:
    ~10 shards) logs the same losses and rewards as with it off, checkpointing on."""
    from run_helpers import numeric_metrics, train, write_run

    runs = {}
    for tiled in ("off", "on"):
        folder = tmp_path / tiled
        cfg = write_run(folder, tiny_model_dir, run={"max_steps": 2},
                        memory={"tiled_mlp": tiled, "gradient_checkpointing": True})
        assert train(str(cfg)) == 0
        runs[tiled] = numeric_metrics(folder / "run")
    assert len(runs["on"]) == len(runs["off"]) >= 2
    for on, off in zip(runs["on"], runs["off"]):
        assert on.keys() == off.keys()
        for key in on:
            if isinstance(on[key], float):
                assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
