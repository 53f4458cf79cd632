"""A budget that the plan fits with less to spare than the CUDA allocator margin gets a warning
(without it the plan said Qwen3-8B QLoRA 2 x 25,600 "fits in 24.00 GiB (0.16 GiB to spare)", with no word of the 10%
the trace adds for the caching allocator)."""

from __future__ import annotations

from slimgrpo.plan.render import headroom_warning
from slimgrpo.trace.step import CUDA_TRACE_MARGIN
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import load_shape

GIB = 2**30


def _plan(device="cuda"):
    return plan_memory(load_shape("llama-3.1-8b"), RunSpec(device=device, lora=True, gradient_checkpointing=True,
                                                               num_generations=2, max_completion_length=4096))


def test_headroom_below_the_allocator_margin_is_named():
    plan = _plan()
    margin = CUDA_TRACE_MARGIN * plan.tensor_peak_bytes
    tight = headroom_warning(plan, int(plan.peak_bytes + 0.5 * margin))
    assert tight and "allocator" in tight and "plan --trace" in tight and "10%" in tight
    assert headroom_warning(plan, int(plan.peak_bytes + 1.01 * margin)) is None
    assert headroom_warning(plan, plan.peak_bytes - 1) is None  # does not fit: said elsewhere
    cpu = _plan("cpu")
    assert headroom_warning(cpu, cpu.peak_bytes + 1) is None  # no CUDA allocator on CPU


def test_plan_command_prints_the_warning(capsys, monkeypatch):
    from slimgrpo.commands.cli import main
    from slimgrpo.config import from_dict, merge_overrides
    from slimgrpo.runspec.run import run_spec

    monkeypatch.setenv("COLUMNS", "300")
    overrides = ["lora.enabled=true", "memory.gradient_checkpointing=true", "rollout.num_generations=2",
                 "run.batch_size=2", "rollout.max_completion_length=4096", "data.max_prompt_length=512"]
    shape = load_shape("llama-3.1-8b")
    plan = plan_memory(shape, run_spec(from_dict(merge_overrides({}, overrides)), "cuda", vocab=shape.vocab))
    args = ["plan", "--model", "llama-3.1-8b", *overrides, "--device", "cuda", "--budget"]
    tight = (plan.peak_bytes + 0.05 * plan.tensor_peak_bytes) / GIB
    assert main(args + [f"{tight:.4f}GiB"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "allocator" in out and "plan --trace" in out
    roomy = (plan.peak_bytes + 0.2 * plan.tensor_peak_bytes) / GIB
    assert main(args + [f"{roomy:.4f}GiB"]) == 0
    assert "allocator" not in capsys.readouterr().out
