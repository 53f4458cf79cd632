"""Unpadded update rows (no attention mask, no O(S²) tensor) and token-budget micro-batches
against the padded reference path."""

import dataclasses
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, Qwen2Config

from slimgrpo.forward.rows import CompletionRows
from slimgrpo.forward.passes import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser
from slimgrpo.forward.unpadded import UnpaddedRows, unpad_rows, unpadded_completion_logprobs
from slimgrpo.update.micro import group_rows
from _update_calls import UpdateBatch, accumulate_gradients, batch_logprobs


def tiny(max_positions=512, seed=0, vocab=97, hidden=32):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      pad_token_id=0, eos_token_id=1, attn_implementation="sdpa")
    return AutoModelForCausalLM.from_config(cfg).float()


def ragged_batch(vocab, rows=7, P=9, T=11, seed=0, prompt_lens=None, comp_lens=None):
    """Left-padded prompts and right-padded completions of different lengths (not chunk multiples)."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = prompt_lens or [int(x) for x in torch.randint(1, P + 1, (rows,), generator=g)]
    comp_lens = comp_lens or [int(x) for x in torch.randint(1, T + 1, (rows,), generator=g)]
    pm = torch.zeros(rows, P, dtype=torch.bool)
    cm = torch.zeros(rows, T, dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompt_lens, comp_lens)):
        pm[i, P - p:] = True
        cm[i, :c] = True
    prompt = torch.randint(3, vocab, (rows, P), generator=g).masked_fill(~pm, 0)
    comp = torch.randint(3, vocab, (rows, T), generator=g).masked_fill(~cm, 0)
    ids = torch.cat([prompt, comp], 1)
    am = torch.cat([pm, cm], 1).long()
    loss_mask = cm.clone()
    loss_mask[0, :] = False  # a row masked out of the loss (e.g. truncated)
    return UpdateBatch(ids, am, comp, loss_mask, torch.randn(rows, generator=g))


def test_unpad_rows_layout():
    b = ragged_batch(50, rows=3, P=4, T=3, prompt_lens=[2, 4, 1], comp_lens=[3, 1, 2])
    ids, p, c = unpad_rows(b.input_ids, b.attention_mask, b.T)
    assert p.tolist() == [2, 4, 1] and c.tolist() == [3, 1, 2]
    assert ids.shape == (3, 5)
    for i in range(3):
        real = b.input_ids[i][b.attention_mask[i].bool()]
        assert ids[i, : len(real)].tolist() == real.tolist()
        assert (ids[i, len(real):] == 0).all()


@pytest.mark.parametrize("token_chunk", [3, None])
def test_unpadded_logprobs_equal_padded_path(token_chunk):
    model = tiny()
    b = ragged_batch(model.config.vocab_size)
    ids, p, _ = unpad_rows(b.input_ids, b.attention_mask, b.T)
    scored = b.attention_mask[:, -b.T:].bool()
    ref, ref_ent = completion_logprobs(model, CompletionRows(b.input_ids, b.attention_mask, b.T, b.completion_ids),
                                       token_chunk=token_chunk, return_entropy=True)
    got, ent = unpadded_completion_logprobs(model, UnpaddedRows(ids, p, b.completion_ids, scored),
                                            token_chunk=token_chunk, return_entropy=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-6)
    assert (got[~scored] == 0).all()


def grads(model, batch, micro=None, micro_tokens=None, loss_type="dapo", ckpt=False):
    model = copy.deepcopy(model)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    settings = LossSettings(loss_type=loss_type, max_completion_length=batch.T, beta=0.04)
    norm = Normaliser(num_sequences=batch.rows, num_tokens=int(batch.loss_mask.sum()))
    stats = accumulate_gradients(model, batch, settings, norm, micro, 1.0, 5, None, micro_tokens=micro_tokens)
    return stats, {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}


def padded_reference_grads(model, batch, loss_type):
    """Today's padded path: one full-batch forward with the attention mask."""
    from slimgrpo.loss.objectives import grpo_loss

    model = copy.deepcopy(model)
    model.train()
    settings = LossSettings(loss_type=loss_type, max_completion_length=batch.T, beta=0.04)
    norm = Normaliser(num_sequences=batch.rows, num_tokens=int(batch.loss_mask.sum()))
    logp, _ = completion_logprobs(model, CompletionRows(batch.input_ids, batch.attention_mask, batch.T,
                                                        batch.completion_ids), token_chunk=5)
    loss, _ = grpo_loss(logp, None, batch.ref_logp, batch.advantages, batch.loss_mask, settings, norm)
    loss.backward()
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_token_budget_micro_batches_keep_the_update(loss_type):
    model = tiny()
    batch = ragged_batch(model.config.vocab_size)
    batch = dataclasses.replace(batch, ref_logp=batch_logprobs(model, batch, None, 1.0, 5, None) - 0.01)
    ref = padded_reference_grads(model, batch, loss_type)
    assert ref
    full_stats, _ = grads(model, batch, loss_type=loss_type)
    for kwargs in ({}, {"micro_tokens": 20}, {"micro_tokens": 37}, {"micro_tokens": 1},
                   {"micro_tokens": 45, "micro": 2}, {"micro_tokens": 30, "ckpt": True}):
        stats, got = grads(model, batch, loss_type=loss_type, **kwargs)
        assert stats.tokens == int(batch.loss_mask.sum())
        assert abs(stats.loss - full_stats.loss) < 1e-6
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=f"{kwargs} {name}")


def test_reference_logprobs_with_a_token_budget_equal_the_padded_path():
    model = tiny()
    b = ragged_batch(model.config.vocab_size)
    ref, _ = completion_logprobs(model, CompletionRows(b.input_ids, b.attention_mask, b.T, b.completion_ids))
    ref = ref * b.attention_mask[:, -b.T:]
    got = batch_logprobs(model, b, None, 1.0, 4, None, micro_tokens=25)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_micro_batches_respect_the_token_budget():
    lengths = torch.tensor([5, 17, 3, 9, 9, 30, 1, 12])
    for budget in (1, 10, 18, 31, 40, 200):
        groups = group_rows(lengths, None, budget)
        seen = sorted(int(i) for g in groups for i in g)
        assert seen == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or len(g) * int(lengths[g].max()) <= budget
    assert len(group_rows(lengths, None, 240)) == 1 and len(group_rows(lengths, None, 239)) == 2
    assert all(len(g) <= 3 for g in group_rows(lengths, 3, 1000))
    assert [g.tolist() for g in group_rows(lengths, 3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def largest_tensor_of_update(S, padded):
    model = tiny(max_positions=8192)
    model.train()
    T = S // 2
    batch = ragged_batch(model.config.vocab_size, rows=2, P=S - T, T=T, prompt_lens=[S - T, S - T - 7],
                         comp_lens=[T, T - 13])
    settings = LossSettings(loss_type="dapo")
    norm = Normaliser(num_sequences=2, num_tokens=int(batch.loss_mask.sum()))
    with LargestTensor() as mode:
        if padded:
            from slimgrpo.loss.objectives import grpo_loss

            logp, _ = completion_logprobs(model, CompletionRows(batch.input_ids, batch.attention_mask, T,
                                                                batch.completion_ids), token_chunk=256)
            grpo_loss(logp, None, None, batch.advantages, batch.loss_mask, settings, norm)[0].backward()
        else:
            accumulate_gradients(model, batch, settings, norm, None, 1.0, 256, None)
    return mode.largest


def test_largest_tensor_of_a_4k_update_grows_linearly():
    small, big = largest_tensor_of_update(2048, False), largest_tensor_of_update(4096, False)
    assert big <= 2.2 * small, (small, big)
    # The padded path's mask is quadratic: the same probe sees it (so this test can fail).
    p_small, p_big = largest_tensor_of_update(512, True), largest_tensor_of_update(1024, True)
    assert p_big >= 3.5 * p_small, (p_small, p_big)


def test_fsdp_micro_batches_split_to_the_count_every_rank_runs():
    """FSDP2: a token budget packs each rank's rows into a different number of micro-batches; with
    ``same_micro_count`` the one iterator (``micro_batches``) asks the ranks for the largest count and splits the
    largest until it has it, keeping every row exactly once."""
    from slimgrpo.collectives import SINGLE
    from slimgrpo.update.batch import UpdateBatch
    from slimgrpo.update.micro import micro_batches, split_to_count
    from slimgrpo.update.settings import UpdateSettings

    class OtherRankHas:  # the Collectives the count agreement asks, as if another rank had t micro-batches
        def __init__(self, t: int):
            self.t, self.asked = t, []

        def max_over_ranks(self, n: int) -> int:
            self.asked.append(n)
            return max(n, self.t)

    rows, S = 7, 11
    lengths = torch.tensor([11, 3, 9, 2, 6, 5, 1])
    am = (torch.arange(S)[None, :] >= S - lengths[:, None]).long()  # left-padded rows of these lengths
    ids = torch.ones(rows, S, dtype=torch.long)
    batch = UpdateBatch(ids, am, ids[:, -3:], am[:, -3:].bool(), torch.zeros(rows))
    settings = UpdateSettings(micro_tokens=12, same_micro_count=True)
    local = len(micro_batches(batch, UpdateSettings(micro_tokens=12), SINGLE))
    for target in (local, local + 1, rows):
        ranks = OtherRankHas(target)
        micros = micro_batches(batch, settings, ranks)
        assert len(micros) == target and ranks.asked == [local]
        assert sorted(torch.cat([torch.as_tensor(m.rows) for m in micros]).tolist()) == list(range(rows))
    unasked = OtherRankHas(rows)  # DDP / one process: no agreement asked
    assert len(micro_batches(batch, UpdateSettings(micro_tokens=12), unasked)) == local and unasked.asked == []
    with pytest.raises(ValueError, match="cannot make 3 micro-batches of 2 rows"):
        split_to_count([torch.tensor([0]), torch.tensor([1])], 3)
