"""Tiled MLP (memory/tiled_mlp.py) against the untiled MLP it replaces: the loss and every gradient, for
Llama, Qwen2 and Qwen3 shapes built in code, token counts the shard size does not divide, LoRA and full
fine-tuning, gradient checkpointing on and off; the live bytes of a layer's backward; an MLP class the
tiler does not know."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.memory.tiled_mlp import (is_tiled, shard_bounds, shard_count, shard_tokens_of, tile_mlps,
                                       untile_mlps)

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ("llama", "qwen2", "qwen3")


def tiny_model(family: str, hidden: int = 16, intermediate: int = 40, layers: int = 2):
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config}[family]
    config = config_class(vocab_size=97, hidden_size=hidden, intermediate_size=intermediate,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                          max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():  # biases and norms away from their init so that every gradient path is exercised
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


def test_shard_arithmetic():
    assert shard_count(74, 16) == 5 and shard_bounds(74, 5) == [(0, 15), (15, 30), (30, 45), (45, 60), (60, 74)]
    assert shard_count(16, 16) == 1 and shard_count(17, 16) == 2
    assert shard_tokens_of(131_072, 4096) == 4096 and shard_tokens_of(4097, 4096) == 2049
    assert sum(b - a for a, b in shard_bounds(1001, 7)) == 1001


def _grads(model, ids, checkpointing: bool):
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    else:
        model.gradient_checkpointing_disable()
    model.train()
    logits = model(input_ids=ids).logits
    loss = (logits.float().log_softmax(-1)[..., 3]).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["full", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "ckpt"])
def test_tiled_equals_untiled(family, mode, checkpointing):
    model = tiny_model(family)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
        with torch.no_grad():  # lora_B starts at zero: move it so the adapters' gradients are not trivial
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, 97, (3, 25), generator=torch.Generator().manual_seed(1))  # 75 tokens: 5 shards of 15
    loss_ref, grads_ref = _grads(model, ids, checkpointing)
    report = tile_mlps(model)
    assert report.tiled == 2 and report.complete
    loss, grads = _grads(model, ids, checkpointing)
    assert grads.keys() == grads_ref.keys() and len(grads) > 0
    if mode == "lora":
        assert all("lora_" in n for n in grads)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=1e-7)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-4, atol=1e-6, msg=name)
    assert untile_mlps(model) == 2


@pytest.mark.parametrize("shard_tokens", [1, 7, 16, 74, 500])
def test_one_mlp_any_shard_size(shard_tokens):
    """The MLP alone, 74 tokens (2 rows of 37) cut into shards of 1 ... 500 tokens; input gradient too."""
    mlp = tiny_model("qwen3", layers=1).model.layers[0].mlp
    x = torch.randn(2, 37, 16, requires_grad=True)
    w = torch.randn(2, 37, 16)

    def run():
        mlp.zero_grad(set_to_none=True)
        x.grad = None
        (mlp(x) * w).sum().backward()
        return x.grad.clone(), {n: p.grad.clone() for n, p in mlp.named_parameters()}

    x_ref, p_ref = run()
    tile_mlps(torch.nn.ModuleDict({"mlp": mlp}), shard_tokens=shard_tokens)
    assert is_tiled(mlp)
    x_tiled, p_tiled = run()
    torch.testing.assert_close(x_tiled, x_ref, rtol=1e-5, atol=1e-6)
    for name in p_ref:
        torch.testing.assert_close(p_tiled[name], p_ref[name], rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # without autograd the shards still run one after the other
        torch.testing.assert_close(mlp(x), mlp.__dict__["_slimgrpo_untiled_forward"](x))


def test_deepcopy_of_a_tiled_model_runs_its_own_weights():
    import copy

    model = tiny_model("llama", layers=1)
    tile_mlps(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.model.layers[0].mlp.parameters():
            p.zero_()
        x = torch.randn(1, 40, 16)
        assert twin.model.layers[0].mlp(x).abs().max() == 0
        assert model.model.layers[0].mlp(x).abs().max() > 0


def _backward_peak(mlp, tokens: int, hidden: int) -> int:
    from slimgrpo.trace.live_bytes import LiveBytes

    x = torch.randn(1, tokens, hidden, requires_grad=True)
    tracker = LiveBytes()
    with tracker:
        out = mlp(x)
        grad = torch.ones_like(out)
        with tracker.phase("backward"):
            out.backward(grad)
    return tracker.phases["backward"].peak_bytes


def test_layer_backward_peak_drops():
    """One layer's MLP on 2,000 tokens of hidden 32, intermediate 256 (fp32): untiled, backward holds the
    gate / up / product tensors of all 2,000 tokens (2 MB each); tiled, those of one 32-token shard."""
    model = tiny_model("llama", hidden=32, intermediate=256, layers=1)
    mlp = model.model.layers[0].mlp
    untiled = _backward_peak(mlp, 2000, 32)
    tile_mlps(model)
    tiled = _backward_peak(mlp, 2000, 32)
    one_tensor = 2000 * 256 * 4
    assert untiled - tiled > 3 * one_tensor, (untiled, tiled)
    assert tiled < untiled / 3


def test_unknown_mlp_class_is_named():
    class GluBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x)

    model = tiny_model("llama", layers=2)
    model.model.layers[1].mlp = GluBlock()
    report = tile_mlps(model)
    assert report.tiled == 1 and not report.complete
    assert "GluBlock" in report.unknown[0] and "LlamaMLP" in report.unknown[0]


def test_mlp_with_dropout_is_left_alone():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model("qwen2", layers=1),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"))
    report = tile_mlps(model)
    assert report.tiled == 0 and "dropout" in report.unknown[0]
