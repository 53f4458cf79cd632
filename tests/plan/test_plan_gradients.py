"""When the plan counts gradients (planner._gradients_in_backward): with one micro-batch per optimizer step
backward writes each layer's gradients as it frees that layer's saved tensors, so at backward's peak only part of
them exist, and all of them at the optimizer step, when the activations are gone; under DDP they live in its
buckets all run. Checked against a naive walk through backward, layer by layer, and against the trace."""

import dataclasses

import pytest

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.runspec.run import run_spec
from slimgrpo.update.costs import CPU_ADAMW_STEP_TEMPORARIES
from slimgrpo.plan.model import plan_memory
from slimgrpo.forward.costs import update_layer_bytes
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.plan.render import assumed_tricks
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.admission import trace_config

# 3 layers and sizes that divide nothing: the walk's first-layer / last-layer cases both occur below
SHAPE = ModelShape("llama", hidden=96, intermediate=260, layers=3, heads=4, kv_heads=2, vocab=1_000, tie=True,
                   max_positions=1 << 16)


def _naive_backward_peak(L: int, g: int, a: int, norms: int) -> int:
    """Peak of saved bytes + gradients through backward, walking down the layers: while layer k runs backward,
    layers 0..k still hold their ``a`` saved bytes and layers k..L-1 have written their ``g`` gradient bytes."""
    return max((k + 1) * a + (L - k) * g + norms for k in reversed(range(L)))


BACKWARD_LINES = ("activations", "backward workspace", "attention mask", "tiled MLP shard", "loss working set")


@pytest.mark.parametrize("completion", [8, 300])  # few tokens: gradients outweigh a layer's saved bytes; many: less
@pytest.mark.parametrize("lora", [False, True])
def test_gradients_line_is_the_naive_walk_or_the_step_moment(completion, lora):
    x = RunSpec(device="cpu", param_dtype_bytes=4, lora=lora, lora_rank=4, num_generations=2, micro_batch_rows=2,
                   max_prompt_length=7, max_completion_length=completion, share_prompt_forward=False)
    plan = plan_memory(SHAPE, x)
    line = plan.bytes_of("gradients")
    n = plan_memory(SHAPE, dataclasses.replace(x, micro_batch_rows=1)).bytes_of("gradients")  # 2 micro-batches: all
    g = n // SHAPE.layers if lora else SHAPE.layer_params * 4
    a = update_layer_bytes(SHAPE, x)[0]
    # the plan holds every layer's a in its activations line: the gradients line is the walk's peak beyond that
    walk = _naive_backward_peak(SHAPE.layers, g, a, 0 if lora else SHAPE.hidden * 4) - SHAPE.layers * a
    # the step moment: every gradient and AdamW's per-tensor temporaries, after backward's lines are freed
    held = sum(c.bytes for c in plan.components if c.name in BACKWARD_LINES)
    largest = 4 * max(max(d) for d in SHAPE.linear_dims().values()) if lora else \
        max(SHAPE.embedding_params, max(i * o for i, o in SHAPE.linear_dims().values()))
    temp = CPU_ADAMW_STEP_TEMPORARIES * largest * 4
    at_step = n + temp - held - max(0, temp - held)
    # the tied embedding's backward: every gradient, and its dense gradient summed with the head's (2 V·H more)
    step_line = max(0, temp - held)
    at_embedding = 0 if lora else n + 2 * SHAPE.embedding_params * 4 - held - step_line
    assert line == max(walk, at_step, at_embedding)
    assert walk <= line
    update = sum(c.bytes for c in plan.components if c.phase == "update" and c.location == "device")
    # the update's total covers every moment, and no more than the largest (the lines are not added twice)
    moments = max(held + walk, n + temp, n + 2 * (0 if lora else SHAPE.embedding_params * 4))
    assert update >= moments
    lines = (*BACKWARD_LINES, "gradients", "optimizer step workspace")
    assert sum(c.bytes for c in plan.components if c.name in lines) == \
        max(held + walk, held + step_line + at_step, held + step_line + at_embedding)
    if completion == 300 and not lora:
        assert line == walk < n  # long completions: the activations outweigh the gradients and the embedding's sum


def test_gradient_accumulation_ddp_and_fsdp_keep_every_gradient():
    x = RunSpec(device="cpu", param_dtype_bytes=4, num_generations=4, micro_batch_rows=4, max_prompt_length=7,
                   max_completion_length=8, share_prompt_forward=False)
    whole = plan_memory(SHAPE, dataclasses.replace(x, micro_batch_rows=2)).bytes_of("gradients")
    assert whole == SHAPE.num_params * 4
    assert plan_memory(SHAPE, x).bytes_of("gradients") < whole  # one micro-batch: part of them at the peak
    ddp = plan_memory(SHAPE, dataclasses.replace(x, ddp=True))
    line = next(c for c in ddp.components if c.name == "gradients")
    assert line.bytes == whole and line.phase == "always"  # DDP's buckets: generation included
    assert ddp.peak_bytes > plan_memory(SHAPE, dataclasses.replace(x, micro_batch_rows=2)).peak_bytes - 1
    fsdp = plan_memory(SHAPE, dataclasses.replace(x, fsdp_shards=2)).bytes_of("gradients")
    assert fsdp == -(-whole // 2)


def test_plan_inputs_says_ddp_only_for_a_ddp_job():
    cfg = from_dict(merge_overrides({}, ["rollout.num_generations=2", "run.batch_size=4"]))
    assert not run_spec(cfg, "cpu").ddp
    assert run_spec(cfg, "cpu", world_size=2).ddp
    fsdp = from_dict(merge_overrides({}, ["rollout.num_generations=2", "run.batch_size=4",
                                          "distributed.strategy=fsdp"]))
    assert not run_spec(fsdp, "cpu", world_size=2).ddp


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("layout", ["unpadded-8", "unpadded-300", "shared"])
def test_the_trace_agrees_on_the_update_with_one_micro_batch(layout, tie, one_thread):
    """Full fine-tuning, fp32, no checkpointing, one micro-batch: the update phase's tensor peak within 10% of
    the plan's, on both sides of g = a, and with a shared prompt, whose pass keeps its saved tensors until the
    completions' backward has reached the embedding (before, the plan added every gradient to every
    activation)."""
    from slimgrpo.plan.render import plan_tensor_bytes

    shape = dataclasses.replace(SHAPE, tie=tie)
    lengths = {"unpadded-8": ["memory.share_prompt_forward=false", "data.max_prompt_length=7",
                              "rollout.max_completion_length=8"],
               "unpadded-300": ["memory.share_prompt_forward=false", "data.max_prompt_length=7",
                                "rollout.max_completion_length=300"],
               "shared": ["memory.share_prompt_forward=true", "data.max_prompt_length=200",
                          "rollout.max_completion_length=24"]}[layout]
    cfg = from_dict(merge_overrides({}, ["rollout.num_generations=4", "run.batch_size=4", "run.device=cpu",
                                         "model.dtype=float32", "memory.tiled_mlp=off", *lengths]))
    x = run_spec(cfg, "cpu", vocab=shape.vocab)
    plan = plan_memory(shape, x)
    assert ("each group's prompt once" in " ".join(assumed_tricks(plan))) == (layout == "shared")
    traced = trace_config(cfg, shape, "cpu", generation=False)
    planned = plan_tensor_bytes(plan, "update")
    assert 0.9 <= traced.phases["update"].peak_bytes / planned <= 1.1, (traced.phases["update"].peak_bytes, planned)
