"""The plan's lines for rollout.engine=vllm (plan/vllm.py): vLLM's own copy of the weights, its KV pool and its
runtime replace the built-in engine's generation lines; on CUDA its claim is a fraction of the GPU, freed
before the update with sleep mode. The pool is the one the engine asks vLLM for (one formula)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.plan.check import plan_inputs
from slimgrpo.plan.planner import PlanInputs, plan_memory
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.vllm import KV_HEADROOM, MIN_KV_BYTES, VLLM_CPU_IMPORT_BYTES
from slimgrpo.rollout import vllm_engine as ve

SMOL = ModelShape(family="llama", hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152,
                  tie=True)  # SmolLM2-135M-Instruct


def lines(plan):
    return {c.name: c for c in plan.components}


def test_cpu_plan_holds_the_copy_the_pool_and_the_runtime_instead_of_the_builtin_engine():
    x = PlanInputs(device="cpu", param_dtype_bytes=4, num_generations=8, prompts_per_step=2, micro_batch_rows=16,
                   max_prompt_length=150, max_completion_length=128)
    own = lines(plan_memory(SMOL, x))
    v = lines(plan_memory(SMOL, PlanInputs(**{**x.__dict__, "rollout_engine": "vllm"})))
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
    x = PlanInputs(device="cpu", param_dtype_bytes=4, rollout_engine="vllm", vllm_weight_bytes=2,
                   vllm_kv_cache_bytes=1 << 30)
    v = lines(plan_memory(SMOL, x))
    assert v["vLLM weights"].bytes == SMOL.num_params * 2 and v["vLLM KV pool"].bytes == 1 << 30
    assert v["vLLM weight sync"].bytes == SMOL.vocab * SMOL.hidden * 2 and v["vLLM weight sync"].phase == "generation"


@pytest.mark.parametrize("sleep", [True, False])
def test_cuda_claim_is_the_fraction_of_the_gpu_and_sleep_frees_it_for_the_update(sleep):
    x = PlanInputs(device="cuda", rollout_engine="vllm", vllm_gpu_memory_utilization=0.3, vllm_sleep=sleep,
                   gpu_total_bytes=80 << 30)
    plan = plan_memory(SMOL, x)
    engine = lines(plan)["vLLM engine"]
    assert engine.bytes == int(0.3 * (80 << 30)) and engine.phase == ("generation" if sleep else "always")
    assert plan.phase_total("generation") >= engine.bytes if sleep else plan.phase_total("always") >= engine.bytes


def test_cuda_plan_off_the_machine_is_a_lower_bound_named_as_such():
    v = lines(plan_memory(SMOL, PlanInputs(device="cuda", rollout_engine="vllm")))
    assert {"vLLM weights", "vLLM KV pool", "vLLM workspace"} <= set(v) and "vLLM engine" not in v
    assert "at least" in v["vLLM KV pool"].formula and v["vLLM KV pool"].bytes >= MIN_KV_BYTES


def test_plan_inputs_read_the_rollout_section():
    cfg = from_dict(merge_overrides({}, ["model.path=m", "data.path=p.jsonl", "rollout.engine=vllm",
                                         "rollout.vllm_dtype=bfloat16", "rollout.vllm_kv_cache_gb=0.5",
                                         "rollout.vllm_sleep_mode=false", "model.dtype=float32"]))
    x = plan_inputs(cfg, "cpu")
    assert (x.rollout_engine, x.vllm_weight_bytes, x.vllm_kv_cache_bytes, x.vllm_sleep) == ("vllm", 2, 1 << 29, False)
    assert plan_inputs(from_dict(merge_overrides({}, ["model.path=m", "data.path=p.jsonl"])), "cpu").rollout_engine \
        == "slimgrpo"  # auto: the built-in engine (rollout/vllm_engine.resolve_engine)
    with pytest.raises(ValueError, match="rollout_engine"):
        PlanInputs(rollout_engine="sglang")


def test_the_tricks_list_names_the_engine_not_the_builtin_decode_packing():
    from slimgrpo.plan.tricks import assumed_tricks

    tricks = assumed_tricks(plan_memory(SMOL, PlanInputs(device="cpu", param_dtype_bytes=4, rollout_engine="vllm")))
    assert any(t.startswith("rollout engine: vLLM, colocated") for t in tricks)
    assert not any(t.startswith("decode weights packed") for t in tricks)
