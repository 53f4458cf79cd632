"""A float16 policy's dynamic loss scale (update/loss_scale.py): LoRA on a float16 base trains float32 adapters,
but backward runs through float16 activations, whose gradients underflow when the loss is averaged over many
tokens. Scaled, the adapters' gradients are the float32 model's; an overflow re-runs the backward at half the
scale instead of skipping the update; the scale is saved with a checkpoint."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from _update_calls import accumulate_gradients, grads_at_optimizer_step
from run_helpers import metrics, train, write_run
from slimgrpo.loss.objectives import LossSettings, Normaliser
from slimgrpo.update import UpdateBatch
from slimgrpo.update.loss_scale import GROWTH_INTERVAL, INITIAL_SCALE, LossScale

pytestmark = pytest.mark.usefixtures("one_thread")


def _lora_model(dtype: torch.dtype):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=301, max_position_embeddings=256, tie_word_embeddings=True)
    base = LlamaForCausalLM(cfg).half().to(dtype)  # the same (float16-rounded) weights in both dtypes
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # adapters train in float32, as modeling.py makes them
    return model


def _adapter_grads(model, batch, norm, scale: float) -> dict[str, torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    accumulate_gradients(model, batch, LossSettings(loss_type="dapo"), norm, None, 1.0, 37, None, loss_scale=scale)
    LossScale(True, scale).unscale(params)
    return {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel_err(got: dict, want: dict) -> float:
    num = sum(float(((got[n] - want[n]) ** 2).sum()) for n in want)
    return (num / sum(float((want[n] ** 2).sum()) for n in want)) ** 0.5


def test_scaled_float16_gradients_match_float32_where_unscaled_ones_underflow():
    """A GRPO loss over a very large batch (the normaliser's token count: each token's share of the loss is
    tiny, as over 8 x 4,096 tokens, where the unscaled float16 adapters' gradients were measured 36% off)."""
    g = torch.Generator().manual_seed(3)
    rows, P, T = 3, 5, 41  # not multiples of the token chunk (37)
    ids = torch.randint(0, 301, (rows, P + T), generator=g)
    am = torch.ones_like(ids)
    am[1, :2] = 0
    batch = UpdateBatch(ids, am, ids[:, -T:], am[:, -T:].bool(), torch.randn(rows, generator=g))
    norm = Normaliser(num_sequences=rows, num_tokens=2**22)
    want = _adapter_grads(_lora_model(torch.float32), batch, norm, 1.0)
    plain = _adapter_grads(_lora_model(torch.float16), batch, norm, 1.0)
    scaled = _adapter_grads(_lora_model(torch.float16), batch, norm, INITIAL_SCALE)
    assert _rel_err(plain, want) > 0.3  # underflow: the reason for the scale
    assert _rel_err(scaled, want) < 0.02


def test_the_scale_halves_on_overflow_and_doubles_after_clean_steps():
    assert not LossScale.for_model(torch.nn.Linear(2, 2)).active  # float32: scale 1, every method a no-op
    s = LossScale.for_model(torch.nn.Linear(2, 2).half())
    assert s.active and s.value == INITIAL_SCALE
    assert s.overflowed() and s.value == INITIAL_SCALE / 2
    for _ in range(GROWTH_INTERVAL - 1):
        s.stepped()
    assert s.value == INITIAL_SCALE / 2
    s.stepped()
    assert s.value == INITIAL_SCALE
    low = LossScale(True, 1.0)
    assert not low.overflowed() and low.value == 1.0  # at 1 a non-finite norm is not the scale's
    restored = LossScale(True)
    restored.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert (restored.value, restored.clean_steps) == (s.value, s.clean_steps)
    off = LossScale(False)
    off.load_state_dict({"value": 8.0, "clean_steps": 1})
    assert off.value == 1.0 and off.state_dict() == {}


def test_an_overflow_is_retried_at_half_the_scale_not_skipped(monkeypatch):
    """The trainer's update stage (``UpdateOnly``: ``Updater.prepare`` + ``step``) on a float16 LoRA model (a
    `slimgrpo train` run refuses float16 on CPU, so the stage runs alone): a starting scale of 2^40 overflows
    the float16 activations' gradients, so the first backward is re-run at half the scale until it is finite;
    no update is skipped, only the adapters move, and the gradients the optimizer steps are the ones at scale 1."""
    from slimgrpo.trace.synthetic import UpdateOnly, random_causal_lm, synthetic_rollout, update_config
    from slimgrpo.runspec.shape import ModelShape

    shape = ModelShape(family="llama", hidden=32, intermediate=48, layers=2, heads=4, kv_heads=2, vocab=97,
                       tie=True)
    cfg = update_config({"lora": {"enabled": True, "r": 4}, "optim": {"max_grad_norm": 0.0},
                         "rollout": {"max_completion_length": 7, "num_generations": 2}, "loss": {"token_chunk": 5}})
    rollout = synthetic_rollout(1, 2, 4, 7, shape.vocab, seed=2)

    def stepped_grads(dtype: torch.dtype):
        model = random_causal_lm(shape, torch.float16, "cpu", seed=4).to(dtype)  # the same weights in both
        torch.manual_seed(7)  # the same adapters
        runner = UpdateOnly(cfg, model)
        seen = grads_at_optimizer_step(runner)
        before = {n: p.detach().clone() for n, p in runner.model.named_parameters()}
        calls = []
        import slimgrpo.update.updater as updater_mod
        inner = updater_mod.accumulate_gradients
        monkeypatch.setattr(updater_mod, "accumulate_gradients", lambda *a, **k: calls.append(k["loss_scale"])
                            or inner(*a, **k))
        result = runner.step(rollout)
        changed = {n for n, p in runner.model.named_parameters() if not torch.equal(before[n], p)}
        return result, seen, calls, changed, runner.updater.loss_scale

    monkeypatch.setattr(LossScale.__init__, "__defaults__", (2.0**40,))
    result, seen, calls, changed, scale = stepped_grads(torch.float16)
    assert not result.skipped and len(calls) > 1 and calls[0] == 2.0**40  # retried, not skipped
    assert calls == [2.0**40 / 2**k for k in range(len(calls))] and scale.value == calls[-1]
    assert changed and all("lora_" in n for n in changed)
    _, reference, ref_calls, _, ref_scale = stepped_grads(torch.float32)  # the float32 model: no scale
    assert ref_calls == [1.0] and not ref_scale.active
    assert set(seen) == set(reference) and _rel_err(seen, reference) < 0.02


def test_a_float32_run_logs_no_loss_scale(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1, "batch_size": 8, "seed": 5, "num_threads": 1,
                                                    "output_dir": str(tmp_path / "run")})
    assert train(cfg) == 0
    assert "loss_scale" not in metrics(tmp_path / "run")[0]


def test_the_loss_scale_is_copied_not_shared():
    s = LossScale(True)
    t = copy.deepcopy(s)
    t.overflowed()
    assert s.value == INITIAL_SCALE
