"""Grouped-query attention on CPU without repeated keys and values (memory/attention.py ``cpu_gqa``).

Hugging Face's sdpa integration repeats K/V to query width whenever a mask is passed; on CPU slimgrpo asks it
for ``enable_gqa`` instead (torch's CPU flash kernel takes it with a mask). Same loss and gradients as the
repeated path, on the masked passes the update runs (shared prompt, padded rows), and the planner's
kv width follows the device.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from slimgrpo.memory import attention
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.forward.shared_prompt import shared_completion_hidden


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config)


def _loss_and_grads(model, device: str):
    """A masked pass (shared prompt with a left-padded prompt, 7 completion tokens: no chunk divides it)."""
    torch.manual_seed(1)
    P, T, G = 5, 7, 3
    prompts = torch.randint(1, 97, (2, P))
    prompt_mask = torch.ones(2, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding: the pass needs a mask
    ids = torch.cat([prompts.repeat_interleave(G, 0), torch.randint(1, 97, (2 * G, T))], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), torch.ones(2 * G, T, dtype=torch.long)], dim=1)
    model.zero_grad(set_to_none=True)
    with attention.cpu_gqa(device):
        hidden, targets, _, _ = shared_completion_hidden(model, ids, mask, T, ids[:, P:])
        logits = model.lm_head(hidden)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_native_gqa_gives_the_repeated_paths_loss_and_gradients(monkeypatch):
    monkeypatch.delenv(attention.GQA_ENV, raising=False)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append((a[1].shape[1], k.get("enable_gqa", False))) or real(*a, **k))
    model = _model()
    loss_native, grads_native = _loss_and_grads(model, "cpu")
    assert seen and all(kv_heads == 2 and gqa for kv_heads, gqa in seen), seen  # K/V kept at 2 heads
    seen.clear()
    loss_repeat, grads_repeat = _loss_and_grads(model, "cuda")  # the switch cleared: HF repeats K/V
    assert seen and all(kv_heads == 6 and not gqa for kv_heads, gqa in seen), seen
    torch.testing.assert_close(loss_native, loss_repeat, rtol=1e-6, atol=1e-6)
    assert grads_native.keys() == grads_repeat.keys()
    for name in grads_native:
        torch.testing.assert_close(grads_native[name], grads_repeat[name], rtol=1e-5, atol=1e-6, msg=name)
    assert attention.GQA_ENV not in os.environ  # restored


def test_a_value_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv(attention.GQA_ENV, "0")
    with attention.cpu_gqa("cpu"):
        assert os.environ[attention.GQA_ENV] == "0"
    assert not attention.native_gqa("cpu")  # and the planner counts repeated K/V then
    with attention.cpu_gqa("cuda"):
        assert os.environ[attention.GQA_ENV] == "0"


def test_the_planner_counts_kv_width_by_device():
    shape = ModelShape.from_hf_config(_model().config.to_dict())
    if not attention.native_gqa("cpu"):
        pytest.skip("this transformers has no TRANSFORMERS_SDPA_FORCE_GQA switch")
    assert attention.kv_width(shape, "sdpa", True, "cpu") == shape.kv_dim
    assert attention.kv_width(shape, "sdpa", True, "cuda") == shape.q_dim
    assert attention.kv_width(shape, "sdpa", False, "cuda") == shape.kv_dim
    assert attention.kv_width(shape, "eager", False, "cpu") == shape.q_dim


def test_transformers_without_the_switch_are_taught_it(monkeypatch):
    """transformers 5.17-5.22 (the lent GPU machine has 5.17) have no TRANSFORMERS_SDPA_FORCE_GQA: their
    ``use_gqa_in_sdpa`` says no under any mask, so K/V were repeated on CPU. cpu_gqa wraps it to read the switch
    as 5.23's does: the native path, same loss and gradients. Here 5.17's rule stands in for the installed one."""
    from transformers.integrations import sdpa_attention

    def rule_of_5_17(attention_mask, key, value):  # CUDA / NPU: no mask, head_dim <= 256; no switch
        return attention_mask is None and key.shape[-1] == value.shape[-1] <= 256

    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", rule_of_5_17)
    monkeypatch.setattr(attention, "_backported", dict(attention._backported))  # what it held comes back after
    attention._gqa_switch.cache_clear()
    try:
        assert attention._gqa_switch() == "backport" and attention.native_gqa("cpu")
        test_native_gqa_gives_the_repeated_paths_loss_and_gradients(monkeypatch)
        wrapped = sdpa_attention.use_gqa_in_sdpa
        assert wrapped is not rule_of_5_17 and attention._gqa_switch() == "backport"
        with attention.cpu_gqa("cpu"):
            attention._backport_switch()  # once: a second call leaves the wrapper as it is
        assert sdpa_attention.use_gqa_in_sdpa is wrapped
    finally:
        attention._gqa_switch.cache_clear()
