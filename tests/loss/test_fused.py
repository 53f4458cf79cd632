"""Fused LM-head log-probs + loss against the separate path (log-probs, then the loss, then backward)."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.loss import fused
from slimgrpo.loss.chunked_head import HeadSpec, chunked_token_logprobs
from slimgrpo.forward.passes import completion_loss
from slimgrpo.config.sections.loss import fused_applicable
from slimgrpo.loss.fused import fused_token_loss
from slimgrpo.forward.rows import CompletionRows
from slimgrpo.forward.passes import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss

ROWS, T, H, V = 3, 13, 16, 211  # 3 x 13 with holes: the scored tokens divide no token_chunk below
TOL = dict(rtol=1e-5, atol=1e-5)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, one intra-op thread


@pytest.fixture
def corrections(monkeypatch) -> list[int]:
    """How often the non-separable fallback (``fused._correct``) runs: one entry a call."""
    calls: list[int] = []
    correct = fused._correct

    def counted(*args, **kwargs):
        calls.append(1)
        return correct(*args, **kwargs)

    monkeypatch.setattr(fused, "_correct", counted)
    return calls


def _case(seed=0, bias=True, head_grad=True):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(ROWS, T, generator=g) > 0.25
    mask[:, 0] = True
    n = int(mask.sum())
    hidden = torch.randn(n, H, generator=g).requires_grad_()
    weight = (0.5 * torch.randn(V, H, generator=g)).requires_grad_(head_grad)
    b = (0.3 * torch.randn(V, generator=g)).requires_grad_(head_grad) if bias else None
    targets = torch.randint(0, V, (n,), generator=g)
    adv = torch.randn(ROWS, generator=g)
    ref = -5.0 + torch.randn(ROWS, T, generator=g)
    old = -5.0 + 0.2 * torch.randn(ROWS, T, generator=g)
    return mask, hidden, weight, b, targets, adv, ref, old


def _leaves(*ts):
    return [t for t in ts if t is not None and t.requires_grad]


def _separate(mask, hidden, weight, b, targets, objective, chunk, **tf):
    head = HeadSpec(weight, b, tf.pop("logit_scale", 1.0), tf.pop("softcap", None))
    lp, ent = chunked_token_logprobs(hidden, head, targets, token_chunk=chunk, return_entropy=True, **tf)
    full = torch.zeros(mask.shape).masked_scatter(mask, lp)
    loss = objective(full)
    return loss, lp, ent, torch.autograd.grad(loss, _leaves(hidden, weight, b))


def _fused(mask, hidden, weight, b, targets, objective, chunk, **tf):
    def flat(x):
        return objective(torch.zeros(mask.shape).masked_scatter(mask, x))

    head = HeadSpec(weight, b, tf.pop("logit_scale", 1.0), tf.pop("softcap", None))
    loss, lp, ent = fused_token_loss(hidden, head, targets, flat, token_chunk=chunk, return_entropy=True, **tf)
    return loss, lp, ent, torch.autograd.grad(loss, _leaves(hidden, weight, b))


def _compare(a, b):
    torch.testing.assert_close(a[0], b[0], **TOL)
    torch.testing.assert_close(a[1], b[1], **TOL)
    torch.testing.assert_close(a[2], b[2], **TOL)
    assert len(a[3]) == len(b[3])
    for x, y in zip(a[3], b[3]):
        torch.testing.assert_close(x, y, **TOL)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
@pytest.mark.parametrize("head_grad", [True, False])
def test_on_policy_matches_separate_path(loss_type, beta, head_grad, corrections):
    mask, hidden, weight, b, targets, adv, ref, _ = _case(head_grad=head_grad)
    settings = LossSettings(loss_type=loss_type, beta=beta, max_completion_length=T)
    norm = Normaliser(num_sequences=ROWS + 2, num_tokens=int(mask.sum()) + 5)  # a micro-batch of a larger batch

    def objective(logp):
        return grpo_loss(logp, None, ref if beta else None, adv, mask, settings, norm)[0]

    for chunk in (7, 64):
        _compare(_fused(mask, hidden, weight, b, targets, objective, chunk),
                 _separate(mask, hidden, weight, b, targets, objective, chunk))
    assert not corrections  # separable: the fallback never ran


@pytest.mark.parametrize("tf", [dict(temperature=0.7), dict(softcap=3.0, logit_scale=0.5, temperature=1.3)])
def test_logit_transforms_and_token_level_old_logp(tf, corrections):
    mask, hidden, weight, b, targets, adv, ref, old = _case(seed=1)
    settings = LossSettings(loss_type="grpo", beta=0.05, epsilon=0.1, delta=1.5)

    def objective(logp):  # token-level ratio with old log-probs: still separable
        return grpo_loss(logp, old, ref, adv, mask, settings, Normaliser.of(mask))[0]

    _compare(_fused(mask, hidden, weight, b, targets, objective, 5, **tf),
             _separate(mask, hidden, weight, b, targets, objective, 5, **tf))
    assert not corrections


def test_non_separable_objective_is_corrected(corrections):
    """GSPO's sequence ratio with old log-probs couples the tokens of a row: the fallback must fix it."""
    mask, hidden, weight, b, targets, adv, ref, old = _case(seed=2)
    settings = LossSettings(loss_type="grpo", importance_sampling_level="sequence")

    def objective(logp):
        return grpo_loss(logp, old, None, adv, mask, settings, Normaliser.of(mask))[0]

    _compare(_fused(mask, hidden, weight, b, targets, objective, 6),
             _separate(mask, hidden, weight, b, targets, objective, 6))
    assert len(corrections) == 1
    assert not fused_applicable("sequence", True, None)
    assert fused_applicable("sequence", False, None) and fused_applicable("token", True, None)
    assert not fused_applicable("token", False, 100)


def test_bf16_hidden_and_head():
    mask, hidden, weight, b, targets, adv, _, _ = _case(seed=3, bias=False)
    h16 = hidden.detach().bfloat16().requires_grad_()
    w16 = weight.detach().bfloat16().requires_grad_()

    def objective(logp):
        return grpo_loss(logp, None, None, adv, mask, LossSettings(), Normaliser.of(mask))[0]

    a = _fused(mask, h16, w16, None, targets, objective, 8)
    s = _separate(mask, h16, w16, None, targets, objective, 8)
    torch.testing.assert_close(a[0], s[0], rtol=1e-3, atol=1e-3)
    for x, y in zip(a[3], s[3]):
        assert x.dtype == torch.bfloat16
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=2e-3)


def test_completion_loss_on_a_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    rows, P, Tc = 3, 5, 9
    V_m = model.config.vocab_size
    ids = torch.randint(0, V_m, (rows, P + Tc), generator=g)
    am = torch.ones_like(ids)
    am[0, :2] = 0  # left padding
    am[1, -3:] = 0  # a short completion
    comp = ids[:, -Tc:]
    mask = am[:, -Tc:].bool()
    adv = torch.randn(rows, generator=g)
    ref = -6.0 + torch.randn(rows, Tc, generator=g)
    settings = LossSettings(beta=0.04)
    norm = Normaliser.of(mask)

    def objective(logp):
        return grpo_loss(logp, None, ref, adv, mask, settings, norm)[0]

    params = [p for p in model.parameters() if p.requires_grad]
    loss, logp, ent = completion_loss(model, CompletionRows(ids, am, Tc, comp), objective, token_chunk=4,
                                      return_entropy=True)
    got = torch.autograd.grad(loss, params)
    lp2, ent2 = completion_logprobs(model, CompletionRows(ids, am, Tc, comp), token_chunk=4, return_entropy=True)
    loss2 = objective(lp2)
    want = torch.autograd.grad(loss2, params)
    torch.testing.assert_close(loss, loss2, **TOL)
    torch.testing.assert_close(logp, lp2.detach(), **TOL)
    torch.testing.assert_close(ent, ent2, **TOL)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, **TOL)


@pytest.mark.parametrize("micro", [None, 2])
def test_accumulate_gradients_fused_equals_separate(tiny_model_dir, micro):
    """The trainer's update with ``loss.fuse_head_loss`` on and off: same loss, stats and gradients."""
    from _update_calls import accumulate_gradients, tiny_update_case

    model, batch = tiny_update_case(tiny_model_dir, with_ref=True)
    settings = LossSettings(loss_type="grpo", beta=0.04)
    norm = Normaliser.of(batch.loss_mask)
    results = []
    for fuse in (True, False):
        model.zero_grad(set_to_none=True)
        st = accumulate_gradients(model, batch, settings, norm, micro, 1.0, 3, None, fuse=fuse)
        results.append((st, [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = results
    assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-6)
    assert a.entropy == pytest.approx(b.entropy, rel=1e-5) and a.kl == pytest.approx(b.kl, rel=1e-5, abs=1e-7)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, **TOL)
