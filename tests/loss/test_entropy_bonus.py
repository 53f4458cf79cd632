"""The entropy bonus (TRL 1.16 ``entropy_coef`` / adaptive entropy control, Skywork-OR1): the chunked head's
entropy gradient, the loss term, micro-batch invariance, the adaptive controller and its checkpoint state."""

from __future__ import annotations

import math

import pytest
import torch
from _reference import naive_token_logprobs

from slimgrpo.loss.chunked_head import HeadSpec, chunked_token_logprobs


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
        logp, ent = fn(h, HeadSpec(w, b, logit_scale=1.3, softcap=softcap), targets, temperature=0.7,
                       token_chunk=8, vocab_chunk=vocab_chunk, entropy_grad=True)
        ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
        grads.append([h.grad] + ([] if frozen else [w.grad, b.grad]))
    for ref, got in zip(*grads):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_entropy_alone_and_without_flag_no_gradient():
    hidden, weight, bias, targets = _head_case(3, bias=False)
    h = hidden.clone().requires_grad_(True)
    _, ent = chunked_token_logprobs(h, HeadSpec(weight), targets, temperature=1.5, token_chunk=5, return_entropy=True)
    assert not ent.requires_grad  # without the bonus the entropy stays a statistic
    h2 = hidden.clone().requires_grad_(True)
    _, ent = chunked_token_logprobs(h2, HeadSpec(weight), targets, temperature=1.5, token_chunk=5, entropy_grad=True)
    ent.sum().backward()
    h3 = hidden.clone().requires_grad_(True)
    _, ref = naive_token_logprobs(h3, HeadSpec(weight), targets, temperature=1.5, entropy_grad=True)
    ref.sum().backward()
    torch.testing.assert_close(h2.grad, h3.grad, rtol=1e-5, atol=1e-5)


# --- the loss term ------------------------------------------------------------------------------

from slimgrpo.loss.entropy_control import EntropyController  # noqa: E402
from slimgrpo.loss.objectives import LossSettings, Normaliser, TokenEntropy, grpo_loss  # noqa: E402

ROWS, T = 5, 7


def _loss_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-2.0 + 0.5 * torch.randn(ROWS, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(ROWS, T, generator=g)
    adv = torch.tensor([1.3, -0.7, -0.4, 1.1, 0.0])
    mask = torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 1, 4])[:, None]
    entropy = (torch.rand(ROWS, T, generator=g) * 3.0).requires_grad_()
    return logp, old, adv, mask, entropy


@pytest.mark.parametrize("kw", [dict(loss_type="dapo"), dict(loss_type="grpo"), dict(loss_type="luspo"),
                                dict(loss_type="grpo", top_entropy_quantile=0.4)])
def test_bonus_equals_token_loop(kw):
    """loss(coef) = loss(0) - coef * (sum of H over the kept tokens) / (their count), from a plain loop, for
    every aggregation (TRL: the bonus is a plain mean whatever the loss type)."""
    coef = 0.37
    logp, old, adv, mask, ent = _loss_case()
    with_bonus, stats = grpo_loss(logp, old, None, adv, mask, LossSettings(entropy_coef=coef, **kw),
                                  Normaliser.of(mask), entropy=TokenEntropy(ent))
    without, _ = grpo_loss(logp, old, None, adv, mask, LossSettings(**kw), Normaliser.of(mask),
                           entropy=TokenEntropy(ent.detach()))
    kept = [(i, t) for i in range(ROWS) for t in range(T) if mask[i, t]]
    q = kw.get("top_entropy_quantile", 1.0)
    if q < 1.0:
        cut = torch.quantile(torch.stack([ent[i, t].detach() for i, t in kept]), 1.0 - q)
        kept = [(i, t) for i, t in kept if ent[i, t] >= cut]
    total = sum(float(ent[i, t].detach()) for i, t in kept)
    assert math.isclose(float((with_bonus - without).detach()), -coef * total / len(kept), rel_tol=1e-5)
    assert stats.bonus_tokens == len(kept) and math.isclose(stats.bonus_entropy_sum, total, rel_tol=1e-5)
    (g,) = torch.autograd.grad(with_bonus, ent)
    want = torch.zeros(ROWS, T)
    for i, t in kept:
        want[i, t] = -coef / len(kept)
    torch.testing.assert_close(g, want)


def test_zero_applied_coef_leaves_policy_loss():
    logp, old, adv, mask, ent = _loss_case(1)
    s = LossSettings(entropy_coef=0.5, use_adaptive_entropy=True)
    a, st = grpo_loss(logp, old, None, adv, mask, s, Normaliser.of(mask), entropy=TokenEntropy(ent, coef=0.0))
    b, _ = grpo_loss(logp, old, None, adv, mask, LossSettings(), Normaliser.of(mask))
    torch.testing.assert_close(a, b)
    assert st.bonus_tokens == int(mask.sum())  # still measured for the controller


# --- TRL parity: its _compute_loss, bonus and controller over several optimizer steps --------------

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


from test_trl_parity import _OneProcess  # noqa: E402  (the one-process accelerator stand-in TRL's loss reads)


def _trl_trainer(coef, adaptive, target, delta=0.05, cmin=0.0, cmax=0.2, quantile=1.0):
    from collections import defaultdict
    from types import SimpleNamespace

    cls = trl_grpo.GRPOTrainer
    args = SimpleNamespace(use_bias_correction_kl=True, delta=None, steps_per_generation=1, entropy_target=target,
                           entropy_coef_delta=delta, entropy_coef_min=cmin, entropy_coef_max=cmax)
    fake = SimpleNamespace(
        args=args, loss_type="dapo", importance_sampling_level="token", beta=0.0, epsilon_low=0.2,
        epsilon_high=0.2, top_entropy_quantile=quantile, off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=T, entropy_coef=coef,
        use_adaptive_entropy=adaptive, _entropy_bonus_enabled=coef != 0.0 or adaptive,
        _last_world_entropy=float("inf"), _entropy_window_stats=None, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)}, accelerator=_OneProcess())
    fake.get_high_entropy_mask = lambda e, m, q: cls.get_high_entropy_mask(fake, e, m, q)
    return fake


def _trl_step(fake, logp, old, adv, mask, ent):
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    inputs = {"prompt_ids": torch.zeros(ROWS, 1, dtype=torch.long), "prompt_mask": torch.ones(ROWS, 1),
              "completion_ids": torch.zeros(ROWS, T, dtype=torch.long), "completion_mask": mask.float(),
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": None,
              "num_items_in_batch": mask.sum().float()}
    return trl_grpo.GRPOTrainer._compute_loss(fake, None, inputs)


@pytest.mark.parametrize("adaptive,quantile", [(False, 1.0), (True, 1.0), (True, 0.5)])
def test_same_losses_gradients_and_coefficients_as_trl(adaptive, quantile):
    """Seven optimizer steps whose entropy crosses the target both ways: each step's loss, gradient wrt log-probs
    and entropies, and logged entropy_coef equal TRL's (one process, one micro-batch per step)."""
    target = 1.2
    fake = _trl_trainer(0.1, adaptive, target, quantile=quantile)
    ctrl = EntropyController(coef=0.1, adaptive=adaptive, coef_min=0.0, coef_max=0.2, delta=0.05, target=target)
    s = LossSettings(entropy_coef=0.1, use_adaptive_entropy=adaptive, top_entropy_quantile=quantile)
    for step, scale in enumerate([0.5, 0.6, 1.5, 2.0, 2.5, 0.4, 0.3]):  # mean entropy ~ scale * 1.5
        logp, old, adv, mask, ent = _loss_case(step)
        ent = (ent.detach() * scale).requires_grad_()
        theirs = _trl_step(fake, logp, old, adv, mask, ent)
        ours, st = grpo_loss(logp, old, None, adv, mask, s, Normaliser.of(mask),
                             entropy=TokenEntropy(ent, coef=ctrl.applied()))
        ctrl.update(st.bonus_entropy_sum, st.bonus_tokens)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        g_ours = torch.autograd.grad(ours, (logp, ent), allow_unused=True)  # entropy unused while gated
        for a, b in zip(g_ours, torch.autograd.grad(theirs, (logp, ent))):
            a = torch.zeros_like(b) if a is None else a
            torch.testing.assert_close(a * mask, b * mask, rtol=1e-5, atol=1e-6)
        assert math.isclose(ctrl.coef, fake._metrics["train"]["entropy_coef"][-1], abs_tol=1e-12)
        assert math.isclose(ctrl.coef, fake.entropy_coef, abs_tol=1e-12)
    assert len(set(fake._metrics["train"]["entropy_coef"])) > (2 if adaptive else 0)


# --- the controller -----------------------------------------------------------------------------


def test_controller_sequence_follows_the_rule():
    """Scripted entropies: coefficient and gate step by step, written out by hand from TRL's rule."""
    c = EntropyController(coef=0.01, adaptive=True, coef_min=0.0, coef_max=0.02, delta=0.005, target=1.0)
    assert c.applied() == 0.0  # no measurement yet: gated
    expected = []
    coef, last = 0.01, math.inf
    for h in [0.5, 0.9, 1.0, 0.2, 3.0, 2.0, 1.5, 1.2, 0.7]:
        applied = coef if last <= 1.0 else 0.0
        assert c.applied() == pytest.approx(applied)
        c.update(h * 10.0, 10.0)
        coef = min(coef + 0.005, 0.02) if h <= 1.0 else max(coef - 0.005, 0.0)
        last = h
        expected.append(coef)
        assert c.coef == pytest.approx(coef) and c.last_entropy == pytest.approx(h)
    assert max(expected) == pytest.approx(0.02) and min(expected) == pytest.approx(0.0)  # both bounds reached


def test_fixed_coefficient_never_moves():
    c = EntropyController(coef=0.3)
    for h in (0.1, 9.0):
        assert c.applied() == 0.3
        c.update(h, 1.0)
    assert c.coef == 0.3


def test_controller_state_round_trip():
    import json

    c = EntropyController(coef=0.01, adaptive=True, target=1.0)
    fresh = EntropyController(coef=0.01, adaptive=True, target=1.0)
    fresh.load_state_dict(json.loads(json.dumps(c.state_dict())))  # before any step: last entropy inf
    assert fresh.applied() == 0.0 and math.isinf(fresh.last_entropy)
    for h in (0.5, 0.4, 2.0):
        c.update(h, 1.0)
    resumed = EntropyController(coef=0.01, adaptive=True, target=1.0)
    resumed.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert (resumed.coef, resumed.last_entropy, resumed.applied()) == (c.coef, c.last_entropy, c.applied())


# --- micro-batching and the trainer ---------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_micro_batching_leaves_gradients_unchanged(tiny_model_dir, loss_type):
    """One micro-batch or three (5 rows, 2 per micro-batch): the same bonus gradient, because the entropy mean
    divides by the whole batch's token count (``Normaliser.entropy_tokens``), as the trainer sets it."""
    from _update_calls import accumulate_gradients, tiny_update_case

    model, batch = tiny_update_case(tiny_model_dir, short_last_row=True)
    rows = batch.rows
    n = int(batch.loss_mask.sum())
    norm = Normaliser(num_sequences=rows, num_tokens=n, entropy_tokens=n)
    results = []
    for coef, micro in ((0.3, None), (0.3, 2), (0.0, None)):
        s = LossSettings(loss_type=loss_type, entropy_coef=coef)
        model.zero_grad(set_to_none=True)
        st = accumulate_gradients(model, batch, s, norm, micro, 0.8, 3, None)
        results.append((st, [p.grad.clone() for p in model.parameters()]))
    (one, g1), (three, g3), (_, g0) = results
    assert math.isclose(one.loss, three.loss, rel_tol=1e-6)
    assert one.bonus_tokens == three.bonus_tokens == n
    assert math.isclose(one.bonus_entropy_sum, three.bonus_entropy_sum, rel_tol=1e-6)
    for a, b in zip(g1, g3):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(g1, g0))  # the bonus moves the gradient


def test_trainer_logs_adapts_and_resumes_the_coefficient(tmp_path, tiny_model_dir):
    """Through the trainer: entropy_coef is logged after every step, grows by delta per optimizer step while the
    entropy is under the target, and a resumed run continues from the checkpoint's coefficient."""
    import json

    from run_helpers import write_run
    from slimgrpo.config import load_config
    from slimgrpo.train.runner import run_training

    path = write_run(tmp_path, tiny_model_dir, loss={"beta": 0.0})
    opts = ["run.save_model=false", "run.save_steps=1", "loss.use_adaptive_entropy=true", "loss.entropy_coef=0.01",
            "loss.entropy_coef_delta=0.002", "loss.entropy_target=1000", "loss.num_iterations=2",
            "memory.micro_batch_size=3"]
    run_training(load_config(path, ["run.max_steps=2", *opts]))
    run_training(load_config(path, ["run.max_steps=3", *opts]))
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    coefs = [r["entropy_coef"] for r in records]
    assert coefs == pytest.approx([0.01 + 0.002 * 2 * k for k in (1, 2, 3)])  # two optimizer steps per step
    state = json.loads((tmp_path / "run" / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["extra"]["entropy_control"]["entropy_coef"] == pytest.approx(0.022)


@pytest.mark.parametrize("freeze_head", [False, True])
def test_completion_entropy_gradient_through_a_model(tiny_model_dir, freeze_head):
    """``completion_logprobs(entropy_grad=True)`` on a real (tiny) causal LM: gradients of a mix of log-probs and
    entropies equal those through the model's full logits, with a trainable head and a frozen one (LoRA-like)."""
    from transformers import AutoModelForCausalLM

    from slimgrpo.forward.rows import CompletionRows
    from slimgrpo.forward.passes import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    if freeze_head:
        model.get_output_embeddings().weight.requires_grad_(False)
    g = torch.Generator().manual_seed(9)
    rows, P, Tc, temp = 3, 4, 6, 0.7
    ids = torch.randint(0, model.config.vocab_size, (rows, P + Tc), generator=g)
    am = torch.ones_like(ids)
    am[2, -2:] = 0
    mask = am[:, -Tc:].bool()
    w1, w2 = torch.randn(rows, Tc, generator=g), torch.randn(rows, Tc, generator=g)
    params = [p for p in model.parameters() if p.requires_grad]

    logp, ent = completion_logprobs(model, CompletionRows(ids, am, Tc, ids[:, -Tc:]), temperature=temp,
                                    token_chunk=4, entropy_grad=True)
    got = torch.autograd.grad(((logp * w1 + ent * w2) * mask).sum(), params)

    pos = (am.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits[:, P - 1:-1].float() / temp
    lp_all = torch.log_softmax(logits, -1)
    ref_logp = lp_all.gather(-1, ids[:, -Tc:, None]).squeeze(-1)
    ref_ent = -(lp_all.exp() * lp_all).sum(-1)
    want = torch.autograd.grad(((ref_logp * w1 + ref_ent * w2) * mask).sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_trl_entropy_keys_map_and_load(tmp_path, tiny_model_dir):
    """A TRL config with the entropy keys converts without refusals into loss.* keys that load and validate."""
    from run_helpers import write_run
    from slimgrpo.config import ConfigError, load_config
    from slimgrpo.trl import convert

    trl = {"entropy_coef": 0.02, "use_adaptive_entropy": True, "entropy_coef_min": 0.001, "entropy_coef_max": 0.1,
           "entropy_coef_delta": 0.004, "entropy_target": 1.5}
    result = convert(trl)
    assert not result.refused, result.refused
    assert {k: result.values[f"loss.{k}"] for k in trl} == trl
    path = write_run(tmp_path, tiny_model_dir)
    cfg = load_config(path, [f"loss.{k}={str(v).lower()}" for k, v in trl.items()])
    c = EntropyController.from_config(cfg.loss)
    assert (c.coef, c.adaptive, c.coef_min, c.coef_max, c.delta, c.target) == (0.02, True, 0.001, 0.1, 0.004, 1.5)
    with pytest.raises(ConfigError, match="entropy_coef_min"):
        load_config(path, ["loss.use_adaptive_entropy=true", "loss.entropy_coef_min=1.5"])  # above the max 1.0
