"""Update-only steps on synthetic completions (slimgrpo.trace.synthetic)."""

from __future__ import annotations

import pytest
import torch

from _update_calls import grads_at_optimizer_step
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.trace.synthetic import (RaggedLengths, UpdateOnly, random_causal_lm, synthetic_advantages, synthetic_rollout,
                                     update_config)

TINY = ModelShape(family="qwen2", hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, vocab=97, tie=True,
                  max_positions=256)


def test_synthetic_rollout_pinned_and_ragged():
    r = synthetic_rollout(2, 3, 7, 11, vocab=50, seed=1)
    assert r.prompt_ids.shape == (2, 7) and r.completion_ids.shape == (6, 11)
    assert bool(r.prompt_mask.all()) and bool(r.completion_mask.all()) and not bool(r.is_truncated.any())
    assert int(r.completion_ids.min()) >= 1 and int(r.completion_ids.max()) < 50  # never the pad id 0
    r = synthetic_rollout(2, 2, 7, 11, vocab=50, lengths=RaggedLengths(prompts=[7, 3], completions=[11, 4, 1, 9]))
    assert r.prompt_mask[1].tolist() == [False] * 4 + [True] * 3  # left-padded
    assert r.completion_lengths.tolist() == [11, 4, 1, 9]
    assert r.is_truncated.tolist() == [True, False, False, False]
    assert (r.completion_ids[~r.completion_mask] == 0).all() and (r.prompt_ids[~r.prompt_mask] == 0).all()
    with pytest.raises(ValueError):
        synthetic_rollout(2, 2, 7, 11, vocab=50, lengths=RaggedLengths(completions=[1, 2, 3]))


def _naive_grads(model, rollout, advantages):
    """d/dθ of the dapo loss with ratio 1: -(1/N) Σ_tokens A_row · log π(token), from full logits."""
    prompt_ids, prompt_mask = rollout.row_prompt_ids()
    ids = torch.cat([prompt_ids, rollout.completion_ids], 1)
    am = torch.cat([prompt_mask, rollout.completion_mask], 1).long()
    pos = (am.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.float()
    T = rollout.completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, -T - 1:-1], -1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    mask = rollout.completion_mask.float()
    loss = -(advantages.unsqueeze(1) * logp * mask).sum() / mask.sum()
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [None, 3])
def test_update_only_gradients_match_naive(micro):
    torch.manual_seed(0)
    model = random_causal_lm(TINY, torch.float32, "cpu", attn_implementation="eager")
    rollout = synthetic_rollout(2, 3, 5, 9, TINY.vocab, seed=3,
                                lengths=RaggedLengths(prompts=[5, 2], completions=[9, 4, 7, 1, 9, 6]))
    adv = synthetic_advantages(rollout.rows, 3)
    expected = _naive_grads(model, rollout, adv)
    cfg = update_config({"memory": {"micro_batch_size": micro}, "optim": {"max_grad_norm": 0.0},
                         "rollout": {"max_completion_length": 9, "num_generations": 3},
                         "loss": {"token_chunk": 4}})
    runner = UpdateOnly(cfg, model)
    seen = grads_at_optimizer_step(runner)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = runner.step(rollout, adv)
    assert result.tokens == int(rollout.completion_mask.sum()) and not result.skipped
    assert set(seen) == set(expected)
    for n in expected:
        torch.testing.assert_close(seen[n], expected[n], rtol=1e-4, atol=1e-6, msg=n)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # the step happened
    # freed when the step returns, not kept through the next generation (a full fine-tune's are weight-sized)
    assert all(p.grad is None for p in model.parameters())


def test_update_only_lora_checkpointing_beta():
    model = random_causal_lm(TINY, torch.float32, "cpu")
    cfg = update_config({"lora": {"enabled": True, "r": 4}, "memory": {"gradient_checkpointing": True},
                         "loss": {"beta": 0.04}, "rollout": {"max_completion_length": 6, "num_generations": 2}})
    runner = UpdateOnly(cfg, model)
    trainable = {n for n, p in runner.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
    result = runner.step(synthetic_rollout(1, 2, 4, 6, TINY.vocab))
    assert result.tokens == 12 and torch.isfinite(torch.tensor(result.loss))
    changed = {n for n, p in runner.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and changed <= trainable


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_random_causal_lm_families(family):
    shape = ModelShape(family=family, hidden=32, intermediate=48, layers=1, heads=4, kv_heads=2, vocab=64,
                       tie=False, head_dim=16)
    model = random_causal_lm(shape, torch.bfloat16, "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) == shape.num_params
