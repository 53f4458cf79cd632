"""``select_cache_rows``: fanning a generation cache out to rows (repeats allowed) moves every state a layer
holds, the keys and values of attention layers and the convolution and recurrent states of linear-attention
(Mamba) layers, which transformers' ``batch_select_indices`` leaves behind. Reference: the same rows
prefilled directly. The engine, the decode steppers, the multi-turn rollout and the shared-prompt forward all
fan caches out through it."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import DynamicCache

from slimgrpo.forward.gather import select_cache_rows


def _hybrid_model():
    if not hasattr(transformers, "NemotronHConfig"):
        pytest.skip("this transformers has no NemotronH")
    cfg = transformers.NemotronHConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=4, mamba_num_heads=8, mamba_head_dim=4, ssm_state_size=16, n_groups=1, conv_kernel=4, expand=2,
        chunk_size=128, layers_block_type=["linear_attention", "full_attention", "mlp"], moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@torch.no_grad()
def test_rows_of_a_hybrid_cache_decode_as_if_prefilled_directly():
    model = _hybrid_model()
    prompts = torch.tensor([[5, 9, 13, 7, 22], [31, 4, 8, 17, 3]])  # two prompts of 5 tokens (no padding)
    rows = torch.tensor([1, 1, 0])  # prompt 1 twice, then prompt 0: not the identity, a repeat

    cache = DynamicCache(config=model.config)
    model(input_ids=prompts, past_key_values=cache, use_cache=True)
    assert any(type(layer).__name__.startswith("LinearAttention") for layer in cache.layers)
    select_cache_rows(cache, rows)
    nxt = torch.tensor([[11], [12], [13]])
    fanned = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]

    direct_cache = DynamicCache(config=model.config)
    model(input_ids=prompts[rows], past_key_values=direct_cache, use_cache=True)
    direct = model(input_ids=nxt, past_key_values=direct_cache, use_cache=True).logits[:, -1]
    torch.testing.assert_close(fanned, direct)


@torch.no_grad()
def test_attention_only_caches_keep_rows_as_batch_select_indices_does(tiny_model_dir):
    tiny_model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    ids = torch.tensor([[5, 9, 13], [31, 4, 8]])
    a, b = DynamicCache(config=tiny_model.config), DynamicCache(config=tiny_model.config)
    tiny_model(input_ids=ids, past_key_values=a, use_cache=True)
    tiny_model(input_ids=ids, past_key_values=b, use_cache=True)
    rows = torch.tensor([0, 0, 1, 0])
    select_cache_rows(a, rows)
    b.batch_select_indices(rows)
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)
