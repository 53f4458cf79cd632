"""Passes without gradients (reference / old-policy log-probs) share each group's prompt only where that holds
no more than the plain pass at its peak: with long completions after a short prompt the completion
pass's [rows, 1, T, P + T] mask (and its float copy inside sdpa) made that pass, not the update, the peak of
W-long 8 x (512 + 8,192): 3.5 GiB measured against a 1.9 GiB plan."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.runspec.run import RunSpec
from slimgrpo.forward.costs import no_grad_pass_bytes, shared_prompt_lighter_without_grad
from slimgrpo.runspec.shape import ModelShape

W_CPU = ModelShape(family="qwen2", hidden=128, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=151_936,
                   tie=True)


def _x(P: int, T: int, rows: int = 8) -> RunSpec:
    return RunSpec(device="cpu", param_dtype_bytes=4, num_generations=rows, micro_batch_rows=rows,
                      max_prompt_length=P, max_completion_length=T, padding_mask=False)


def test_w_long_no_grad_pass_plain():
    """W-long 8 x (512 + 8,192): shared, the pass holds the 0.53 GiB bool mask, its 2.1 GiB float copy and the
    cache; plain, one layer's working set over 69,632 tokens."""
    x = _x(512, 8192)
    shared, plain = no_grad_pass_bytes(W_CPU, x, 1), no_grad_pass_bytes(W_CPU, x, 0)
    mask = 8 * 8192 * 8704
    assert shared >= 5 * mask > plain  # bool + fp32 copy
    assert not shared_prompt_lighter_without_grad(W_CPU, x, 1)


def test_long_prompt_no_grad_pass_shared():
    """A long prompt with short completions: running the prompt once is lighter, so the pass shares."""
    x = _x(4096, 128)
    assert no_grad_pass_bytes(W_CPU, x, 1) < no_grad_pass_bytes(W_CPU, x, 0)
    assert shared_prompt_lighter_without_grad(W_CPU, x, 1)
    assert not shared_prompt_lighter_without_grad(W_CPU, x, 8)  # every row its own group: nothing to share


@pytest.mark.usefixtures("one_thread")
def test_no_grad_layout_follows_the_verdict(tiny_model_dir):
    """The layout the reference / old log-prob pass runs: plain for a short prompt before long completions
    (the old code shared wherever rows shared a prompt), shared for a long prompt before short ones."""
    from transformers import AutoModelForCausalLM

    from slimgrpo.forward import packed, shared_prompt
    from slimgrpo.forward.rows import CompletionRows
    from slimgrpo.forward.layout import choose_layout, shared_groups
    from slimgrpo.forward.layout import PromptSharing
    from slimgrpo.update.settings import UpdateSettings

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)

    def rows(P: int, T: int, n: int = 4):
        prompt = torch.randint(3, model.config.vocab_size, (P,), generator=g)
        ids = torch.cat([prompt.expand(n, P), torch.randint(3, model.config.vocab_size, (n, T), generator=g)], 1)
        return ids, torch.ones_like(ids)

    sharing = PromptSharing.of(model)
    ids, am = rows(6, 600)
    assert shared_prompt.shares_work(model, ids, am, 600)  # the rows do share a prompt
    assert shared_groups(model, CompletionRows(ids, am, 600, ids[:, -600:]), sharing, with_grad=False) == 0
    assert not packed.cheaper(model, ids, am, 600, 0)
    layout = choose_layout(model, CompletionRows(ids, am, 600, ids[:, -600:]), sharing,
                           with_grad=False)
    assert layout is not shared_prompt.shared_completion_hidden
    ids, am = rows(600, 6)
    assert shared_groups(model, CompletionRows(ids, am, 6, ids[:, -6:]), sharing, with_grad=False) == 1
