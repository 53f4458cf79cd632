"""The planner knows the attention kernel and the token-budget micro-batches."""

import dataclasses

from slimgrpo.memory.advice import fit_to_budget
from slimgrpo.memory.planner import GiB, PlanInputs, plan_memory
from slimgrpo.memory.shapes import load_shape

QWEN = load_shape("qwen2.5-0.5b")


def update_bytes(x):
    plan = plan_memory(QWEN, x)
    return plan.bytes_of("activations") + plan.bytes_of("attention mask")


def test_sdpa_and_flash_update_grow_linearly_eager_quadratically():
    base = PlanInputs(device="cpu", param_dtype_bytes=4, num_generations=2, micro_batch_rows=2,
                      max_prompt_length=128, max_completion_length=4096 - 128)
    longer = dataclasses.replace(base, max_completion_length=8192 - 128)
    for kernel in ("sdpa", "flash_attention_2"):
        a, b = update_bytes(dataclasses.replace(base, attn_implementation=kernel)), update_bytes(
            dataclasses.replace(longer, attn_implementation=kernel))
        assert 1.9 < b / a < 2.1, kernel
        assert plan_memory(QWEN, dataclasses.replace(base, attn_implementation=kernel)).bytes_of("attention mask") == 0
    a, b = update_bytes(dataclasses.replace(base, attn_implementation="eager")), update_bytes(
        dataclasses.replace(longer, attn_implementation="eager"))
    assert b / a > 3.0 and a > 3 * update_bytes(base)


def test_unknown_kernel_is_said():
    plan = plan_memory(QWEN, PlanInputs(device="cpu", attn_implementation="flex_attention"))
    assert any("flex_attention" in n and "not modelled" in n for n in plan.notes)
    assert not plan_memory(QWEN, PlanInputs(device="cpu")).notes


def test_token_budget_sets_rows_per_micro_batch():
    x = PlanInputs(device="cpu", num_generations=8, micro_batch_rows=8, max_prompt_length=100,
                   max_completion_length=924)
    assert x.micro_rows == 8
    assert dataclasses.replace(x, micro_batch_tokens=3000).micro_rows == 2
    assert dataclasses.replace(x, micro_batch_tokens=10).micro_rows == 1
    assert update_bytes(dataclasses.replace(x, micro_batch_tokens=2048)) < update_bytes(x) / 3


def test_fit_halves_the_token_budget():
    x = PlanInputs(device="cpu", lora=True, num_generations=16, micro_batch_rows=16, max_prompt_length=256,
                   max_completion_length=8192 - 256, micro_batch_tokens=16 * 8192, gradient_checkpointing=True,
                   optimizer="adamw_8bit", vocab_chunk=32768, token_chunk=128)
    peak = plan_memory(QWEN, x).peak_bytes
    final, steps, fits = fit_to_budget(QWEN, x, peak - GiB)
    assert fits and any("micro_batch_tokens" in s.change for s in steps)
    assert final.micro_batch_tokens < x.micro_batch_tokens


def test_quantised_kv_cache_is_counted():
    x = PlanInputs(device="cuda", num_generations=8, max_prompt_length=256, max_completion_length=8192)
    full = plan_memory(QWEN, x).bytes_of("KV cache")
    for kind in ("int8", "fp8_e4m3"):
        q = plan_memory(QWEN, dataclasses.replace(x, kv_cache_dtype=kind)).bytes_of("KV cache")
        # bf16 -> 1 byte + fp32 scale per 64-value head (1.0625 B), plus one layer dequantised
        expected = full / 2 * (1 + 4 / QWEN.head_dim) + full / QWEN.layers
        assert abs(q - expected) <= 8
