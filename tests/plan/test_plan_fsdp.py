"""The per-rank plan of an FSDP2 job (plan/sharding.py) and `slimgrpo plan --nproc N`."""

from __future__ import annotations

import dataclasses
import math

import pytest

from slimgrpo.commands.cli import main
from slimgrpo.config import from_dict
from slimgrpo.runspec.run import run_spec
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape, load_shape
from slimgrpo.plan.sharding import SHARDED, root_group_params

# Odd sizes: the shard sizes do not divide evenly (ceil per rank).
SHAPE = ModelShape(family="llama", hidden=72, intermediate=200, layers=3, heads=6, kv_heads=2, vocab=1001, tie=False)


def _by_name(plan):
    return {c.name: c for c in plan.components}


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("ppo", [False, True])
def test_sharded_lines_are_one_rank_share_plus_the_gathered_groups(lora, ppo):
    # two micro-batches: whole gradients in both plans (with one, the unsharded plan counts only those alive at
    # backward's peak, planner._gradients_in_backward, which a sharded one does not)
    base = RunSpec(device="cuda", lora=lora, lora_rank=4, ppo=ppo, gradient_checkpointing=True,
                      num_generations=2, micro_batch_rows=1, max_prompt_length=33, max_completion_length=17)
    one = _by_name(plan_memory(SHAPE, base))
    for n in (2, 3, 8):
        four = _by_name(plan_memory(SHAPE, dataclasses.replace(base, fsdp_shards=n)))
        sharded = [name for name in one if name in SHARDED]
        assert "weights" in sharded and "optimizer state" in sharded and "gradients" in sharded
        assert not ppo or any(name.startswith("critic") for name in sharded)
        for name, c in one.items():
            expected = math.ceil(c.bytes / n) if name in SHARDED else c.bytes
            assert four[name].bytes == expected, (name, n)
        b = base.param_dtype_bytes
        root, layer = root_group_params(SHAPE), SHAPE.layer_params
        assert four["FSDP2 unsharded groups"].bytes == (root + 2 * layer) * b + (0 if lora else layer * b)
        assert four["FSDP2 unsharded groups"].phase == "update"
        assert four["FSDP2 gathered weights"].bytes == SHAPE.num_params * b
        assert four["FSDP2 gathered weights"].phase == "generation"
    per_layer = _by_name(plan_memory(SHAPE, dataclasses.replace(base, fsdp_shards=2, fsdp_generation="per_layer")))
    assert per_layer["FSDP2 gathered weights"].bytes == (root_group_params(SHAPE) + SHAPE.layer_params) * 2


def test_one_rank_of_eight_matches_the_documented_formula():
    """docs/distributed.md: sharded state (P·b + P·b + 2·P·b) / N per rank; gather adds P·b while sampling."""
    shape = load_shape("llama-3.1-8b")
    x = RunSpec(device="cuda", gradient_checkpointing=True, num_generations=8, max_completion_length=1024)
    whole, sharded = plan_memory(shape, x), plan_memory(shape, dataclasses.replace(x, fsdp_shards=8))
    P, b = shape.num_params, 2
    state = sum(c.bytes for c in sharded.components if c.name in ("weights", "gradients", "optimizer state"))
    assert abs(state - 4 * P * b / 8) <= 3
    assert sharded.peak_bytes < whole.peak_bytes / 2  # 8 ranks: the 60 GiB of state is what shrinks


def test_plan_inputs_shard_only_under_fsdp_with_several_ranks():
    cfg = from_dict({"model": {"path": "m"}, "data": {"path": "d"}, "run": {"batch_size": 16}, "rollout": {"num_generations": 2},
                     "distributed": {"strategy": "fsdp", "fsdp_generation": "per_layer"}})
    assert run_spec(cfg, "cuda", 4).fsdp_shards == 4
    assert run_spec(cfg, "cuda", 4).fsdp_generation == "per_layer"
    assert run_spec(cfg, "cuda", 1).fsdp_shards == 1
    cfg.distributed.strategy = "ddp"
    assert run_spec(cfg, "cuda", 4).fsdp_shards == 1
    assert run_spec(cfg, "cuda", 4).rows == 16 // 4  # DDP: the rank's share of the batch only


def test_plan_command_plans_one_rank_and_refuses_an_uneven_split(capsys):
    args = ["plan", "--model", "llama-3.1-8b", "--device", "cuda", "run.batch_size=64", "rollout.num_generations=8",
            "distributed.strategy=fsdp", "memory.gradient_checkpointing=true"]
    assert main([*args, "--nproc", "8"]) == 0
    out = capsys.readouterr().out
    assert "one rank of 8" in out and "FSDP2 gathered weights" in out and "/ 8 ranks" in out
    assert main([*args, "--nproc", "3"]) == 2
    err = capsys.readouterr().err
    assert "--nproc 3" in err and "cannot share evenly" in err


@pytest.mark.parametrize("lora, dtype_bytes, eight_bit", [(False, 2, False), (True, 2, True), (False, 4, True)])
def test_the_fit_never_suggests_8bit_adamw_where_fsdp2_refuses_it(lora, dtype_bytes, eight_bit):
    """bfloat16 full fine-tuning under FSDP2 with memory.optimizer=adamw_8bit is refused at validation
    (config/precision.py): the fit leaves the optimizer alone there; LoRA and float32 weights may still take it."""
    from slimgrpo.plan.search import fit_to_budget

    x = RunSpec(device="cuda", lora=lora, lora_rank=4, param_dtype_bytes=dtype_bytes, fsdp_shards=4,
                   num_generations=2, max_prompt_length=33, max_completion_length=17)
    _, steps, _ = fit_to_budget(SHAPE, x, 1)  # nothing fits one byte: the fit tries every rung it may
    at = x
    for step in steps:  # never 8-bit AdamW while the run is still bfloat16 full fine-tuning
        assert not ("optimizer" in step.change and not at.lora and at.param_dtype_bytes == 2), steps
        at = dataclasses.replace(at, **step.change)
    changed = [k for s in steps for k in s.change]
    assert "optimizer" in changed  # LoRA first where it was full fine-tuning, then 8-bit AdamW on the adapters
    if not eight_bit:
        assert changed.index("lora") < changed.index("optimizer")
