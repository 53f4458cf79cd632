"""The entropy bonus (TRL 1.16 ``entropy_coef`` / adaptive entropy control, Skywork-OR1): the chunked head's
entropy gradient, the loss term, micro-batch invariance, the adaptive controller and its checkpoint state."""

from __future__ import annotations

import math

import pytest
import torch

from slimgrpo.loss.chunked_head import chunked_token_logprobs, naive_token_logprobs


def _head_case(seed, n=37, H=11, V=53, bias=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g, dtype=dtype)
    weight = torch.randn(V, H, generator=g, dtype=dtype) * 0.7
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    targets = torch.randint(0, V, (n,), generator=g)
    return hidden, weight, b, targets


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("vocab_chunk", [None, 16])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_entropy_gradient_matches_autograd(frozen, vocab_chunk, softcap):
    hidden, weight, bias, targets = _head_case(0)
    w_logp = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(1))
    w_ent = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(2))
    grads = []
    for fn in (naive_token_logprobs, chunked_token_logprobs):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(not frozen)
        b = bias.clone().requires_grad_(not frozen)
        logp, ent = fn(h, w, targets, bias=b, temperature=0.7, logit_scale=1.3, softcap=softcap,
                       token_chunk=8, vocab_chunk=vocab_chunk, entropy_grad=True)
        ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
        grads.append([h.grad] + ([] if frozen else [w.grad, b.grad]))
    for ref, got in zip(*grads):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_entropy_alone_and_without_flag_no_gradient():
    hidden, weight, bias, targets = _head_case(3, bias=False)
    h = hidden.clone().requires_grad_(True)
    _, ent = chunked_token_logprobs(h, weight, targets, temperature=1.5, token_chunk=5, return_entropy=True)
    assert not ent.requires_grad  # without the bonus the entropy stays a statistic
    h2 = hidden.clone().requires_grad_(True)
    _, ent = chunked_token_logprobs(h2, weight, targets, temperature=1.5, token_chunk=5, entropy_grad=True)
    ent.sum().backward()
    h3 = hidden.clone().requires_grad_(True)
    _, ref = naive_token_logprobs(h3, weight, targets, temperature=1.5, entropy_grad=True)
    ref.sum().backward()
    torch.testing.assert_close(h2.grad, h3.grad, rtol=1e-5, atol=1e-5)
