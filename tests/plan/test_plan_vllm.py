"""The plan's lines for rollout.engine=vllm (rollout/costs.py): vLLM's own copy of the weights, its KV pool and its
runtime replace the built-in engine's generation lines (on CUDA a workspace stand-in in place of the runtime,
all freed before the update with sleep mode; gpu_memory_utilization is a start-up check, a note). The pool is
the one the engine asks vLLM for (one formula)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.runspec.run import run_spec
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.rollout.costs import KV_HEADROOM, MIN_KV_BYTES, VLLM_CPU_IMPORT_BYTES
from slimgrpo.rollout import vllm_engine as ve

SMOL = ModelShape(family="llama", hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152,
                  tie=True)  # SmolLM2-135M-Instruct


def lines(plan):
    return {c.name: c for c in plan.components}


def test_cpu_plan_holds_the_copy_the_pool_and_the_runtime_instead_of_the_builtin_engine():
    x = RunSpec(device="cpu", param_dtype_bytes=4, num_generations=8, prompts_per_step=2, micro_batch_rows=16,
                   max_prompt_length=150, max_completion_length=128)
    own = lines(plan_memory(SMOL, x))
    v = lines(plan_memory(SMOL, RunSpec(**{**x.__dict__, "rollout_engine": "vllm"})))
    assert "KV cache" in own and "KV cache" not in v and "decode weights" not in v
    assert v["vLLM weights"].bytes == SMOL.num_params * 4 and v["vLLM weights"].phase == "always"
    assert v["vLLM runtime"].bytes == VLLM_CPU_IMPORT_BYTES
    pool = int(2 * 4 * SMOL.layers * SMOL.kv_heads * SMOL.head_dim * 16 * 278 * KV_HEADROOM)
    assert v["vLLM KV pool"].bytes == pool
    # the engine asks vLLM for the same pool (same formula, same rows and length)
    conf = SimpleNamespace(num_hidden_layers=SMOL.layers, num_key_value_heads=SMOL.kv_heads,
                           num_attention_heads=SMOL.heads, hidden_size=SMOL.hidden, head_dim=SMOL.head_dim)
    assert ve.kv_cache_bytes(conf, 16 * 278, 4) == pool
    assert "vLLM weight sync" not in v  # fp32 policy, fp32 vLLM, no LoRA: the live tensors go as they are


def test_a_bf16_engine_under_an_fp32_policy_halves_the_copy_and_converts_one_tensor_at_a_time():
    x = RunSpec(device="cpu", param_dtype_bytes=4, rollout_engine="vllm", vllm_weight_bytes=2,
                   vllm_kv_cache_bytes=1 << 30)
    v = lines(plan_memory(SMOL, x))
    assert v["vLLM weights"].bytes == SMOL.num_params * 2 and v["vLLM KV pool"].bytes == 1 << 30
    assert v["vLLM weight sync"].bytes == SMOL.vocab * SMOL.hidden * 2 and v["vLLM weight sync"].phase == "generation"


@pytest.mark.parametrize("sleep", [True, False])
def test_cuda_plan_is_the_copy_the_pool_and_a_workspace_and_sleep_frees_them_for_the_update(sleep):
    """The engine gives vLLM its KV pool by size (kv_cache_memory_bytes, which vLLM documents as ignoring
    gpu_memory_utilization), so on a known GPU the plan holds the copy, the pool and the workspace, not a
    fraction of the GPU; the fraction is a start-up check, stated as a note."""
    x = RunSpec(device="cuda", rollout_engine="vllm", vllm_gpu_memory_utilization=0.3, vllm_sleep=sleep,
                   gpu_total_bytes=80 << 30, num_generations=8, prompts_per_step=2, max_prompt_length=150,
                   max_completion_length=128, param_dtype_bytes=2)
    plan = plan_memory(SMOL, x)
    v = lines(plan)
    assert "vLLM engine" not in v
    phase = "generation" if sleep else "always"
    assert all(v[name].phase == phase for name in ("vLLM weights", "vLLM KV pool", "vLLM workspace"))
    assert v["vLLM weights"].bytes == SMOL.num_params * 2
    assert v["vLLM KV pool"].bytes == max(MIN_KV_BYTES, int(2 * 2 * SMOL.layers * SMOL.kv_heads * SMOL.head_dim
                                                            * 16 * 278 * KV_HEADROOM))
    engine = sum(v[n].bytes for n in ("vLLM weights", "vLLM KV pool", "vLLM workspace"))
    assert engine < 0.3 * (80 << 30) / 10  # a 135M model's engine is far below the fraction's 24 GiB
    assert plan.phase_total(phase) >= engine
    note = next(n for n in plan.notes if "vllm_gpu_memory_utilization" in n)
    assert "0.3" in note and "leaves it" in note


def test_cuda_start_check_says_when_the_fraction_is_not_free():
    x = RunSpec(device="cuda", rollout_engine="vllm", vllm_gpu_memory_utilization=0.9, gpu_total_bytes=16 << 30,
                   param_dtype_bytes=4)  # fp32 SmolLM2 + fp32 AdamW moments hold ~2 GiB throughout
    note = next(n for n in plan_memory(SMOL, x).notes if "vllm_gpu_memory_utilization" in n)
    assert "does NOT leave it" in note and "lower rollout.vllm_gpu_memory_utilization to 0.8" in note


def test_cuda_plan_off_the_machine_names_the_start_check_it_cannot_make():
    plan = plan_memory(SMOL, RunSpec(device="cuda", rollout_engine="vllm"))
    v = lines(plan)
    assert {"vLLM weights", "vLLM KV pool", "vLLM workspace"} <= set(v) and "vLLM engine" not in v
    assert v["vLLM KV pool"].bytes >= MIN_KV_BYTES
    assert any("no GPU visible here" in n for n in plan.notes)
    assert not any("vllm_gpu_memory_utilization" in n for n in plan_memory(SMOL, RunSpec(device="cuda")).notes)


def test_plan_inputs_read_the_rollout_section():
    cfg = from_dict(merge_overrides({}, ["model.path=m", "data.path=p.jsonl", "rollout.engine=vllm",
                                         "rollout.vllm_dtype=bfloat16", "rollout.vllm_kv_cache_gb=0.5",
                                         "rollout.vllm_sleep_mode=false", "model.dtype=float32"]))
    x = run_spec(cfg, "cpu")
    assert (x.rollout_engine, x.vllm_weight_bytes, x.vllm_kv_cache_bytes, x.vllm_sleep) == ("vllm", 2, 1 << 29, False)
    assert run_spec(from_dict(merge_overrides({}, ["model.path=m", "data.path=p.jsonl"])), "cpu").rollout_engine \
        == "slimgrpo"  # auto: the built-in engine (rollout/vllm_engine.resolve_engine)
    with pytest.raises(ValueError, match="rollout_engine"):
        RunSpec(rollout_engine="sglang")


def test_the_tricks_list_names_the_engine_not_the_builtin_decode_packing():
    from slimgrpo.plan.render import assumed_tricks

    tricks = assumed_tricks(plan_memory(SMOL, RunSpec(device="cpu", param_dtype_bytes=4, rollout_engine="vllm")))
    assert any(t.startswith("rollout engine: vLLM, colocated") for t in tricks)
    assert not any(t.startswith("decode weights packed") for t in tricks)
