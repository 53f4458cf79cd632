"""QLoRA in the compute dtype.

A 4-bit base keeps its non-quantised tensors (embedding, LM head, norms) in the model's dtype; only the LoRA
adapters are fp32. peft's ``prepare_model_for_kbit_training`` cast them to fp32, which made the residual
stream and every gradient checkpoint fp32 (twice the plan's bytes). Checked with the NF4 stand-in on CPU
(``trace/standins.py``) and, where a GPU and bitsandbytes are present, with bitsandbytes itself.
"""

from __future__ import annotations

import pytest
import torch

from slimgrpo.runspec.shape import ModelShape
from slimgrpo.trace.synthetic import random_causal_lm, update_config

SHAPE = ModelShape(family="qwen3", hidden=96, intermediate=200, layers=3, heads=4, kv_heads=2, vocab=301,
                   tie=False, max_positions=512, head_dim=24)


def _prepared(model):
    from slimgrpo.modeling import prepare_for_training

    cfg = update_config({"model": {"load_in_4bit": True, "dtype": "bfloat16"}, "lora": {"enabled": True, "r": 4},
                         "memory": {"gradient_checkpointing": True}})
    return prepare_for_training(model, cfg)[0]


def _dtypes_through_a_step(model, device):
    """Forward (checkpointed, train mode) and backward; the dtype of every decoder layer's input (what
    non-reentrant checkpointing keeps for each layer) and output, and of the decoder's output."""
    from slimgrpo.causal_lm import unwrap_causal_lm

    seen: dict[str, set[torch.dtype]] = {"layer inputs": set(), "layer outputs": set(), "decoder output": set()}
    decoder = unwrap_causal_lm(model).get_decoder()
    hooks = []
    for layer in decoder.layers:
        hooks.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs: seen["layer inputs"].add((args[0] if args else kwargs["hidden_states"]).dtype),
            with_kwargs=True))
        hooks.append(layer.register_forward_hook(
            lambda m, args, out: seen["layer outputs"].add((out[0] if isinstance(out, tuple) else out).dtype)))
    hooks.append(decoder.register_forward_hook(lambda m, args, out: seen["decoder output"].add(out[0].dtype)))
    ids = torch.randint(2, SHAPE.vocab, (2, 17), generator=torch.Generator().manual_seed(0)).to(device)
    try:
        model.train()
        logits = model(input_ids=ids).logits
        logits.float().sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _fp32_mlp_inputs_kept(model, device) -> int:
    """fp32 tensors of the MLP's width that autograd keeps in a forward without checkpointing: peft's input
    cast makes one per layer for down_proj's adapter; adapters computing in the input's dtype make none."""
    from slimgrpo.causal_lm import unwrap_causal_lm

    kept = []

    def pack(t):
        if t.dtype == torch.float32 and t.shape[-1] == SHAPE.intermediate and t.numel() >= 2 * 17 * SHAPE.intermediate:
            kept.append(t.shape)
        return t

    unwrap_causal_lm(model).gradient_checkpointing_disable()
    ids = torch.randint(2, SHAPE.vocab, (2, 17), generator=torch.Generator().manual_seed(0)).to(device)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids)
    finally:
        unwrap_causal_lm(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return len(kept)


def _check(model, device):
    from slimgrpo.causal_lm import unwrap_causal_lm

    base = unwrap_causal_lm(model)
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    assert base.get_output_embeddings().weight.dtype == torch.bfloat16
    norms = [p for n, p in base.named_parameters() if "norm" in n]
    assert norms and all(p.dtype == torch.bfloat16 for p in norms)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    seen = _dtypes_through_a_step(model, device)
    assert seen == {k: {torch.bfloat16} for k in seen}, seen
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable.values())
    assert _fp32_mlp_inputs_kept(model, device) == 0  # the adapters compute in bf16 (modeling.InputDtypeLinear)


def test_nf4_standin_base_keeps_the_compute_dtype():
    from slimgrpo.trace.standins import NF4Linear, quantize_standin

    torch.manual_seed(0)
    model = quantize_standin(random_causal_lm(SHAPE, torch.bfloat16, "cpu"))
    with torch.no_grad():  # the stand-in stores no real weights; give the rest finite values
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.normal_(0, 0.02)
    assert any(isinstance(m, NF4Linear) for m in model.modules())
    _check(_prepared(model), "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bitsandbytes_base_keeps_the_compute_dtype(tmp_path):
    pytest.importorskip("bitsandbytes")
    from slimgrpo.config import ModelConfig
    from slimgrpo.modeling import load_model

    random_causal_lm(SHAPE, torch.bfloat16, "cpu").save_pretrained(str(tmp_path))
    model = load_model(ModelConfig(path=str(tmp_path), load_in_4bit=True), torch.device("cuda"), torch.bfloat16)
    assert any("4bit" in type(m).__name__ for m in model.modules())
    _check(_prepared(model), "cuda")


def test_the_old_cast_would_be_caught():
    """The check above fails on peft's fp32 cast (the behaviour this replaces): its residual stream, and so
    every checkpointed layer input, is fp32."""
    from peft import prepare_model_for_kbit_training

    from slimgrpo.trace.standins import quantize_standin

    model = quantize_standin(random_causal_lm(SHAPE, torch.bfloat16, "cpu"))
    model = _prepared(prepare_model_for_kbit_training(model, use_gradient_checkpointing=False))
    with pytest.raises(AssertionError):
        _check(model, "cpu")
    assert torch.float32 in _dtypes_through_a_step(model, "cpu")["layer inputs"]  # fp32 checkpoints


def test_peft_input_cast_would_be_caught():
    """The adapters' check fails on peft's own forward, which casts each adapter's input to fp32."""
    from slimgrpo.trace.standins import quantize_standin

    model = _prepared(quantize_standin(random_causal_lm(SHAPE, torch.bfloat16, "cpu")))
    for m in model.modules():
        if hasattr(m, "cast_input_dtype_enabled"):
            m.cast_input_dtype_enabled = True
    assert _fp32_mlp_inputs_kept(model, "cpu") == SHAPE.layers
