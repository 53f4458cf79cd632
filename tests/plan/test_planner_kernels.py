"""The planner knows the attention kernel and the token-budget micro-batches."""

import dataclasses

import pytest

from slimgrpo.plan.search import fit_to_budget
from slimgrpo.runspec.cost import GiB
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import load_shape

QWEN = load_shape("qwen2.5-0.5b")


def update_bytes(x):
    plan = plan_memory(QWEN, x)
    return plan.bytes_of("activations") + plan.bytes_of("attention mask")


def test_sdpa_and_flash_update_grow_linearly_eager_quadratically():
    base = RunSpec(device="cpu", param_dtype_bytes=4, num_generations=2, micro_batch_rows=2,
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
    plan = plan_memory(QWEN, RunSpec(device="cpu", attn_implementation="flex_attention"))
    assert any("flex_attention" in n and "not modelled" in n for n in plan.notes)
    assert not plan_memory(QWEN, RunSpec(device="cpu")).notes


def test_token_budget_sets_rows_per_micro_batch():
    x = RunSpec(device="cpu", num_generations=8, micro_batch_rows=8, max_prompt_length=100,
                   max_completion_length=924)
    assert x.micro_rows == 8
    assert dataclasses.replace(x, micro_batch_tokens=3000).micro_rows == 2
    assert dataclasses.replace(x, micro_batch_tokens=10).micro_rows == 1
    assert update_bytes(dataclasses.replace(x, micro_batch_tokens=2048)) < update_bytes(x) / 3


def test_fit_halves_the_token_budget():
    x = RunSpec(device="cpu", lora=True, num_generations=16, micro_batch_rows=16, max_prompt_length=256,
                   max_completion_length=8192 - 256, micro_batch_tokens=16 * 8192, gradient_checkpointing=True,
                   optimizer="adamw_8bit", vocab_chunk=32768, token_chunk=128)
    peak = plan_memory(QWEN, x).peak_bytes
    final, steps, fits = fit_to_budget(QWEN, x, peak - GiB)
    assert fits and any("micro_batch_tokens" in s.change for s in steps)
    assert final.micro_batch_tokens < x.micro_batch_tokens


def test_quantised_kv_cache_is_counted():
    x = RunSpec(device="cuda", num_generations=8, max_prompt_length=256, max_completion_length=8192)
    full = plan_memory(QWEN, x).bytes_of("KV cache")
    for kind in ("int8", "fp8_e4m3"):
        q = plan_memory(QWEN, dataclasses.replace(x, kv_cache_dtype=kind)).bytes_of("KV cache")
        # bf16 -> 1 byte + fp32 scale per 64-value head (1.0625 B), plus one layer dequantised
        expected = full / 2 * (1 + 4 / QWEN.head_dim) + full / QWEN.layers
        assert abs(q - expected) <= 8


def _saved_layer_bytes(fn, m: int, P: int, T: int, groups: int, lora: bool) -> int:
    """Bytes autograd keeps for decoder layer 1 while ``fn`` (an update hidden function) runs on m rows
    of ``groups`` prompts of P tokens and T completion tokens (parameters and rotary tables excluded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=128, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).float().train()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        rotary = t.dim() == 4 and t.shape[1] == 1 and t.shape[-1] == 8  # cos/sin [b, 1, S, head_dim]
        if t.untyped_storage().data_ptr() not in params and not rotary:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    layer = model.get_decoder().layers[1]
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    layer.register_forward_pre_hook(lambda *a: hooks.__enter__())
    layer.register_forward_hook(lambda *a: hooks.__exit__(None, None, None))
    prompts = torch.randint(0, 128, (groups, P)).repeat_interleave(m // groups, 0)
    ids = torch.cat([prompts, torch.randint(0, 128, (m, T))], 1)
    fn(model, ids, torch.ones_like(ids), T, ids[:, P:])
    return sum(seen.values())


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("m, G", [(4, 4), (4, 2)])
@pytest.mark.parametrize("device", ["cpu", "cuda"])  # cuda: HF's rule there (a mask repeats K/V), run on CPU
def test_update_layer_bytes_match_autograd_plain_and_shared_prompt(lora, m, G, device):
    """The planner's one-layer update bytes equal what autograd saves, with and without shared prompts."""
    from slimgrpo.forward.unpadded import unpadded_hidden
    from slimgrpo.memory.attention import cpu_gqa
    from slimgrpo.forward.costs import shared_prompt_groups, update_layer_bytes
    from slimgrpo.runspec.shape import ModelShape
    from slimgrpo.forward.shared_prompt import shared_completion_hidden

    shape = ModelShape.from_hf_config({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 176,
                                       "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                                       "vocab_size": 128})
    P, T = 23, 10  # 33 tokens per row: divides no chunk size
    x = RunSpec(device=device, param_dtype_bytes=4, lora=lora, lora_rank=4, num_generations=G,
                   prompts_per_step=m // G, micro_batch_rows=m, max_prompt_length=P, max_completion_length=T,
                   padding_mask=False)  # equal-length prompts: no prompt padding
    groups = shared_prompt_groups(x, shape)
    assert groups == m // G
    with cpu_gqa(device):
        saved = _saved_layer_bytes(shared_completion_hidden, m, P, T, groups, lora)
        assert update_layer_bytes(shape, x)[0] == saved
        plain = dataclasses.replace(x, share_prompt_forward=False)
        assert shared_prompt_groups(plain, shape) == 0
        assert update_layer_bytes(shape, plain)[0] == _saved_layer_bytes(unpadded_hidden, m, P, T, groups, lora)


def test_shared_prompt_plan_is_smaller_and_off_with_checkpointing():
    x = RunSpec(device="cpu", param_dtype_bytes=4, num_generations=8, micro_batch_rows=8,
                   max_prompt_length=2048, max_completion_length=256)
    shared, plain = update_bytes(x), update_bytes(dataclasses.replace(x, share_prompt_forward=False))
    assert shared < plain / 3
    ckpt = dataclasses.replace(x, gradient_checkpointing=True)
    assert plan_memory(QWEN, ckpt).components == plan_memory(
        QWEN, dataclasses.replace(ckpt, share_prompt_forward=False)).components
