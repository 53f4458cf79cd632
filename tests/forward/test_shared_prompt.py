"""Shared prompts in the update: gradients equal to the plain path (every row runs its own prompt)."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.forward import shared_prompt
from slimgrpo.forward.rows import CompletionRows
from slimgrpo.loss.objectives import LossSettings, Normaliser
from slimgrpo.forward.packed import row_groups
from slimgrpo.forward.layout import shared_groups
from slimgrpo.forward.layout import PromptSharing
from _update_calls import UpdateBatch, accumulate_gradients

TOL = dict(rtol=1e-5, atol=1e-5)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, one intra-op thread


def _batch(vocab: int, G: int = 3, P: int = 6, T: int = 5, seed: int = 0) -> UpdateBatch:
    """3 groups of G rows: left-padded prompts of lengths 6, 4, 2; completions of varying length."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in (P, P - 2, P - 4)]
    rows = []
    for p in prompts:
        for _ in range(G):
            ids = torch.full((P,), 0, dtype=torch.long)
            ids[P - len(p):] = p
            am = torch.zeros(P, dtype=torch.long)
            am[P - len(p):] = 1
            comp = torch.randint(3, vocab, (T,), generator=g)
            n = int(torch.randint(1, T + 1, (1,), generator=g))
            cm = (torch.arange(T) < n).long()
            rows.append((torch.cat([ids, comp * cm]), torch.cat([am, cm])))
    ids = torch.stack([r[0] for r in rows])
    am = torch.stack([r[1] for r in rows])
    k = len(rows)
    return UpdateBatch(ids, am, ids[:, -T:], am[:, -T:].bool(), torch.randn(k, generator=g),
                       ref_logp=-6.0 + torch.randn(k, T, generator=g))


def _applicable(model, ids: torch.Tensor, am: torch.Tensor, T: int) -> int:
    """The groups the update (with gradients) shares these rows as: ``layout.shared_groups`` with the model's
    ``PromptSharing`` (the planner's verdict, read once)."""
    return shared_groups(model, CompletionRows(ids, am, T, ids[:, -T:]), PromptSharing.of(model), with_grad=True)


def test_row_groups():
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [3, 4], [1, 2]])
    first, group = row_groups(ids, torch.ones_like(ids))
    assert first.tolist() == [0, 2, 4] and group.tolist() == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("micro", [None, 4])  # 4 splits groups of 3
@pytest.mark.parametrize("fuse", [True, False])
def test_shared_prompt_gradients_equal_plain(tiny_model_dir, micro, fuse):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    batch = _batch(model.config.vocab_size)
    assert _applicable(model, batch.input_ids, batch.attention_mask, batch.T)
    settings = LossSettings(loss_type="grpo", beta=0.04)
    norm = Normaliser.of(batch.loss_mask)
    out = []
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        st = accumulate_gradients(model, batch, settings, norm, micro, 1.0, 4, None, fuse=fuse, share_prompt=share)
        out.append((st, [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = out
    assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-6)
    assert a.entropy == pytest.approx(b.entropy, rel=1e-5)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, **TOL)


def test_not_applicable_with_checkpointing_or_distinct_prompts(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    batch = _batch(model.config.vocab_size, G=1)
    assert not _applicable(model, batch.input_ids, batch.attention_mask, batch.T)
    model.gradient_checkpointing_enable()
    batch = _batch(model.config.vocab_size)
    assert not _applicable(model, batch.input_ids, batch.attention_mask, batch.T)


def test_shared_only_where_it_saves_memory(tiny_model_dir):
    """Long completions after a short prompt: the completion pass's [rows, 1, T, P + T] mask and repeated
    keys/values would outweigh the prompt saved, so the plain update runs (the planner's verdict)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    short_prompt = _batch(model.config.vocab_size, P=6, T=200)
    assert not _applicable(model, short_prompt.input_ids, short_prompt.attention_mask, short_prompt.T)
    long_prompt = _batch(model.config.vocab_size, P=200, T=6)
    assert _applicable(model, long_prompt.input_ids, long_prompt.attention_mask, long_prompt.T)
    # the gradient test's micro-batches of 4 rows (groups of 3 split) still share
    b = _batch(model.config.vocab_size)
    assert _applicable(model, b.input_ids[:4], b.attention_mask[:4], b.T)


@pytest.mark.parametrize("micro", [None, 4])  # 4 splits groups of 3
def test_no_grad_logprobs_shared_equal_plain(tiny_model_dir, micro, monkeypatch):
    """Reference / old-policy log-probs: the shared-prompt pass gives the plain pass's values, and it is
    used whenever rows share a prompt, even where the update would not share (no activations are kept)."""
    from transformers import AutoModelForCausalLM

    from _update_calls import batch_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    batch = _batch(model.config.vocab_size, T=7)
    calls = []
    real = shared_prompt.shared_completion_hidden
    monkeypatch.setattr(shared_prompt, "shared_completion_hidden", lambda *a, **k: calls.append(1) or real(*a, **k))
    # the update (with gradients) would not share; a pass without gradients still does
    monkeypatch.setattr(PromptSharing, "lighter", lambda self, *a, with_grad, **k: not with_grad)
    from slimgrpo.forward import packed

    monkeypatch.setattr(packed, "cheaper", lambda *a, **k: False)  # the fanned-out layout (packing: test_packed)
    shared, ent_s = batch_logprobs(model, batch, micro, 0.7, 4, None, want_entropy=True, share_prompt=True)
    assert calls, "rows share prompts: the no-grad pass should run each prompt once"
    plain, ent_p = batch_logprobs(model, batch, micro, 0.7, 4, None, want_entropy=True, share_prompt=False)
    assert len(calls) == (1 if micro is None else 2)  # micro 4 of 9 rows: the last slice has one row
    torch.testing.assert_close(shared, plain, **TOL)
    torch.testing.assert_close(ent_s, ent_p, **TOL)
    assert bool((plain[batch.loss_mask] < 0).all()) and bool((plain[~batch.loss_mask] == 0).all())
