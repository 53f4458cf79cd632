"""The packed update layout (forward/packed.py): hidden states and gradients equal to the plain padded path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from slimgrpo.forward import packed
from slimgrpo.forward.rows import completion_hidden
from slimgrpo.loss.objectives import LossSettings, Normaliser
from _update_calls import UpdateBatch, accumulate_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(kind: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    common = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, attn_implementation=attn)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()


def _batch(seed: int = 0, groups=(7, 5, 2), G: int = 3, T: int = 9):
    """Groups of G rows with left-padded prompts of the given lengths (P = 7, which no chunk divides) and
    right-padded completions of ragged lengths 1..T (one row per batch reaches T)."""
    g = torch.Generator().manual_seed(seed)
    P = max(groups)
    ids, am = [], []
    for n in groups:
        prompt = torch.randint(3, 61, (n,), generator=g)
        for j in range(G):
            c = T if (n, j) == (groups[0], 0) else int(torch.randint(1, T, (1,), generator=g))
            row = torch.zeros(P + T, dtype=torch.long)
            mask = torch.zeros(P + T, dtype=torch.long)
            row[P - n:P], mask[P - n:P] = prompt, 1
            row[P:P + c], mask[P:P + c] = torch.randint(3, 61, (c,), generator=g), 1
            ids.append(row)
            am.append(mask)
    return torch.stack(ids), torch.stack(am), T


@pytest.mark.parametrize("kind,attn", [("llama", "sdpa"), ("qwen2", "sdpa"), ("llama", "eager")])
def test_packed_hidden_and_gradients_equal_the_padded_path(kind, attn):
    model = _model(kind, attn)
    ids, am, T = _batch()
    comp = ids[:, -T:]
    cmask = am[:, -T:].clone()
    cmask[1, 0] = 0  # a token of context that is not scored (as tool output in agent rollouts)
    out = {}
    for name, fn in (("plain", completion_hidden), ("packed", packed.packed_completion_hidden)):
        model.zero_grad(set_to_none=True)
        hidden, targets, mask, _ = fn(model, ids, am, T, comp, cmask)
        weights = torch.linspace(-1, 1, hidden.numel()).view_as(hidden)
        (hidden * weights).sum().backward()
        out[name] = (hidden.detach(), targets, mask, [p.grad for p in model.parameters() if p.grad is not None])
    (h0, t0, m0, g0), (h1, t1, m1, g1) = out["plain"], out["packed"]
    assert torch.equal(t0, t1) and torch.equal(m0, m1) and len(g0) == len(g1) > 0
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_update_takes_the_packed_layout_where_it_is_cheaper(monkeypatch):
    """Completions of very different lengths after a short prompt: packing is chosen, and the update's
    loss and gradients equal those with sharing off (the unpadded layout)."""
    model = _model("qwen2")
    ids, am, T = _batch(groups=(4, 4, 3), G=4, T=24)  # 3 groups (two with equal length, different ids)
    assert packed.cheaper(model, ids, am, T, shared_groups=3)
    calls = []
    real = packed.packed_completion_hidden
    monkeypatch.setattr(packed, "packed_completion_hidden", lambda *a, **k: calls.append(1) or real(*a, **k))
    mask = am[:, -T:].bool()
    g = torch.Generator().manual_seed(1)
    batch = UpdateBatch(ids, am, ids[:, -T:], mask, torch.randn(ids.shape[0], generator=g),
                        ref_logp=-4.0 + torch.randn(ids.shape[0], T, generator=g))
    settings = LossSettings(loss_type="dapo", beta=0.04)
    norm = Normaliser.of(batch.loss_mask)
    results = []
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        stats = accumulate_gradients(model, batch, settings, norm, None, 1.0, 5, None, fuse=True, share_prompt=share)
        results.append((stats, [p.grad.clone() for p in model.parameters()]))
    assert calls, "the packed layout was not used"
    (s1, g1), (s0, g0) = results
    torch.testing.assert_close(torch.tensor(s1.loss), torch.tensor(s0.loss), rtol=1e-5, atol=1e-6)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_packing_is_not_chosen_where_it_costs_more_or_cannot_run(monkeypatch):
    model = _model("llama")
    ids, am, T = _batch()
    # every completion as long as the longest: nothing to save on padding, and N^2 attention costs more
    full = am.clone()
    full[:, -T:] = 1
    assert not packed.cheaper(model, ids, full, T, shared_groups=3)
    # a completion with a hole in its mask is not the rollout's layout
    holed = am.clone()
    holed[0, -T + 1] = 0
    assert not packed.cheaper(model, ids, holed, T, shared_groups=3)
    with pytest.raises(ValueError, match="left-padded prompts"):
        packed.packed_completion_hidden(model, ids, holed, T, ids[:, -T:])
    # the batch as it is packs; with fewer tokens allowed than it has, it does not
    assert packed.cheaper(model, ids, am, T, shared_groups=0)
    monkeypatch.setattr(packed, "MAX_TOKENS", 20)
    assert not packed.cheaper(model, ids, am, T, shared_groups=0)


def test_row_groups():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [3, 4], [1, 2]])
    first, group = packed.row_groups(ids, torch.ones_like(ids))
    assert first.tolist() == [0, 2, 4] and group.tolist() == [0, 0, 1, 1, 2]


def test_reference_logprobs_take_the_packed_layout_and_equal_the_plain_ones(monkeypatch):
    """The no-grad passes (reference / old policy) pack too where it is cheaper: same log-probs."""
    from _update_calls import batch_logprobs

    model = _model("llama")
    ids, am, T = _batch(groups=(5, 5, 2), G=4, T=24)
    assert packed.cheaper(model, ids, am, T, shared_groups=3)
    calls = []
    real = packed.packed_completion_hidden
    monkeypatch.setattr(packed, "packed_completion_hidden", lambda *a, **k: calls.append(1) or real(*a, **k))
    mask = am[:, -T:].bool()
    batch = UpdateBatch(ids, am, ids[:, -T:], mask, torch.zeros(ids.shape[0]))
    shared, ent_s = batch_logprobs(model, batch, None, 0.7, 5, None, want_entropy=True, share_prompt=True)
    assert calls, "the packed layout was not used"
    plain, ent_p = batch_logprobs(model, batch, None, 0.7, 5, None, want_entropy=True, share_prompt=False)
    torch.testing.assert_close(shared[mask], plain[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_s[mask], ent_p[mask], rtol=1e-5, atol=1e-5)
