"""Activation offload (slimgrpo.train.offload): gradients identical with and without it."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.runspec.shape import ModelShape
from slimgrpo.update.offload import AsyncOffload, offload_context
from slimgrpo.trace.synthetic import random_causal_lm

SHAPE = ModelShape(family="llama", hidden=48, intermediate=80, layers=3, heads=4, kv_heads=2, vocab=101, tie=False)


def _grads(model, ids, ctx_factory, checkpointing: bool):
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    with ctx_factory():
        logits = model(input_ids=ids).logits
    loss = torch.log_softmax(logits.float(), -1)[..., :7].sum() / ids.numel()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_async_offload_gradients_identical_cpu(checkpointing):
    model = random_causal_lm(SHAPE, torch.float32, "cpu", attn_implementation="eager")
    ids = torch.randint(0, SHAPE.vocab, (3, 13), generator=torch.Generator().manual_seed(0))
    hooks = []

    def offloading():
        h = AsyncOffload(min_bytes=0, device_types=("cpu",))
        hooks.append(h)
        return h

    import contextlib

    reference = _grads(model, ids, contextlib.nullcontext, checkpointing)
    got = _grads(model, ids, offloading, checkpointing)
    assert hooks[0].offloaded > 0 and hooks[0].offloaded_bytes > 0  # the hooks did move tensors
    assert reference.keys() == got.keys()
    for n in reference:
        assert torch.equal(reference[n], got[n]), n


def test_async_offload_keeps_parameters_and_small_tensors():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with AsyncOffload(min_bytes=0, device_types=("cpu",)) as h:
        y = lin(x).relu().sum()
    # Linear saves its input (a leaf that requires grad: kept) and its weight (a Parameter: kept);
    # relu saves its output (moved).
    assert h.offloaded == 1
    y.backward()
    with AsyncOffload(min_bytes=1 << 20, device_types=("cpu",)) as h2:
        lin(x).relu().sum()
    assert h2.offloaded == 0


def test_offload_context_cpu_fallback_is_save_on_cpu():
    assert isinstance(offload_context(True, torch.device("cpu")), torch.autograd.graph.save_on_cpu)
    assert not isinstance(offload_context(False, torch.device("cpu")), torch.autograd.graph.saved_tensors_hooks)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_async_offload_gradients_identical_cuda(checkpointing):
    model = random_causal_lm(SHAPE, torch.float32, "cuda")
    ids = torch.randint(0, SHAPE.vocab, (3, 13), device="cuda")
    import contextlib

    reference = _grads(model, ids, contextlib.nullcontext, checkpointing)
    hooks = []

    def offloading():
        hooks.append(AsyncOffload(min_bytes=0))
        return hooks[-1]

    got = _grads(model, ids, offloading, checkpointing)
    assert hooks[0].offloaded > 0
    for n in reference:
        assert torch.equal(reference[n], got[n]), n
