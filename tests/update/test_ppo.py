"""PPO with a learned critic (loss.advantage_estimator=gae): the pure math against plain loops, the critic's
gradients, the planner's lines, and a bit-identical resume with the critic and its optimizer state."""

from __future__ import annotations

import dataclasses

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import cli, numeric_metrics, start_cli, write_run
from slimgrpo.advantage import gae as adv
from slimgrpo.collectives import SINGLE
from slimgrpo.config import ConfigError, from_dict, validate_config
from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss, value_loss
from slimgrpo.update import UpdateSettings, batch_totals

pytestmark = pytest.mark.usefixtures("one_thread")


def _ragged(rows=5, T=7, seed=0, holes=True):
    """Random rewards and values with ragged lengths (0..T tokens; T = 7 divides no chunk size) and, with
    ``holes``, masked tokens inside a row (tool results of a multi-turn completion)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 3, 0, 5, 1][:rows])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if holes:
        mask[0, 2] = mask[0, 3] = False
        mask[3, 1] = False
    return torch.randn(rows, T, generator=g), torch.randn(rows, T, generator=g), mask


def _gae_loop(rewards, values, mask, gamma, lam):
    """GAE one row and one token at a time, over the row's masked tokens only."""
    A = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[i, t]]
        running = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = float(values[i, steps[k + 1]]) if k + 1 < len(steps) else 0.0
            delta = float(rewards[i, t]) + gamma * next_v - float(values[i, t])
            running = delta + gamma * lam * running
            A[i, t] = running
    return A, torch.where(mask, A + values, torch.zeros_like(A))


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_a_plain_loop_on_ragged_rows(gamma, lam, holes):
    rewards, values, mask = _ragged(holes=holes)
    got_a, got_r = adv.gae(rewards, values, mask, gamma, lam)
    want_a, want_r = _gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(got_a, want_a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_r, want_r, rtol=1e-5, atol=1e-6)
    assert not got_a[~mask].any() and not got_r[~mask].any()


def test_token_rewards_score_at_the_last_token_and_kl_on_every_token():
    _, _, mask = _ragged()
    old, ref = torch.randn(mask.shape), torch.randn(mask.shape)
    scores = torch.tensor([1.0, 0.5, 2.0, float("nan"), -1.0])
    got = adv.token_rewards(scores, mask, old, ref, kl_coef=0.1)
    want = torch.zeros(mask.shape)
    for i in range(mask.shape[0]):
        idx = [t for t in range(mask.shape[1]) if mask[i, t]]
        for t in idx:
            want[i, t] = -0.1 * (old[i, t] - ref[i, t])
        if idx and not torch.isnan(scores[i]):
            want[i, idx[-1]] += scores[i]
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="kl_coef"):
        adv.token_rewards(scores, mask, kl_coef=0.1)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_against_a_naive_one(shift_mean):
    x, _, mask = _ragged(seed=3)
    vals = x[mask].double()
    mean, var = vals.mean(), vals.var()  # unbiased, as TRL's masked_var
    want = (x.double() - mean) / torch.sqrt(var + 1e-8)
    if not shift_mean:
        want = want + mean
    want = torch.where(mask, want, torch.zeros_like(want)).float()
    torch.testing.assert_close(adv.masked_whiten(x, mask, shift_mean), want, rtol=1e-5, atol=1e-6)


def test_value_loss_and_its_clip_against_a_naive_reference():
    g = torch.Generator().manual_seed(1)
    _, _, mask = _ragged()
    v_old = torch.randn(mask.shape, generator=g)
    returns = torch.randn(mask.shape, generator=g)
    v = (v_old + 0.5 * torch.randn(mask.shape, generator=g)).requires_grad_(True)  # many beyond the 0.2 clip
    c, coef = 0.2, 0.5
    norm = Normaliser.of(mask)
    loss, stats = value_loss(v, v_old, returns, mask, c, norm, vf_coef=coef)
    total, clipped, n = 0.0, 0, 0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            vi = float(v.detach()[i, t])
            vc = min(max(vi, float(v_old[i, t]) - c), float(v_old[i, t]) + c)
            a, b = (vi - float(returns[i, t])) ** 2, (vc - float(returns[i, t])) ** 2
            total += 0.5 * max(a, b)
            clipped += b > a
            n += 1
    assert loss.item() == pytest.approx(coef * total / n, rel=1e-5)
    assert stats["value/loss"] == pytest.approx(total / n, rel=1e-5)
    assert stats["value/clipfrac"] == pytest.approx(clipped / n)
    assert 0 < clipped < n
    # micro-batches of awkward sizes add up to the whole batch's loss and gradient
    loss.backward()
    whole = v.grad.clone()
    v.grad = None
    parts = sum(value_loss(v[a:b], v_old[a:b], returns[a:b], mask[a:b], c, norm, coef)[0] for a, b in [(0, 2), (2, 5)])
    parts.backward()
    assert parts.item() == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(v.grad, whole)
    # where the clipped error is the larger and the value moved past the clip, no gradient reaches it
    vd = v.detach()
    outside = mask & ((vd - v_old).abs() > c) & ((torch.clamp(vd, v_old - c, v_old + c) - returns) ** 2 >
                                                  (vd - returns) ** 2)
    assert outside.any() and not whole[outside].any()


def test_per_token_advantages_equal_row_advantages_broadcast():
    g = torch.Generator().manual_seed(2)
    _, _, mask = _ragged(holes=False)
    logp = torch.randn(mask.shape, generator=g).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(mask.shape, generator=g)
    a = torch.randn(mask.shape[0], generator=g)
    s, norm = LossSettings(loss_type="dapo"), Normaliser.of(mask)
    l1, st1 = grpo_loss(logp, old, None, a, mask, s, norm)
    l2, st2 = grpo_loss(logp, old, None, a[:, None].expand(mask.shape).clone(), mask, s, norm)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-6)
    assert st1.clip_ratio_region == pytest.approx(st2.clip_ratio_region)


def test_explained_variance():
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones_like(r, dtype=torch.bool)
    assert adv.explained_variance(r, r, m) == pytest.approx(1.0)
    assert adv.explained_variance(torch.full_like(r, 2.5), r, m) == pytest.approx(0.0)


# --- config ------------------------------------------------------------------------------------------------


def _cfg(**loss):
    return from_dict({"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": {"functions": ["length"]},
                      "loss": {"advantage_estimator": "gae", **loss}})


def test_config_checks_and_help_lists_the_keys():
    validate_config(_cfg())
    with pytest.raises(ConfigError, match="loss_type=dapo"):
        validate_config(_cfg(loss_type="cispo", epsilon_high=5.0))
    with pytest.raises(ConfigError, match="gamma"):
        validate_config(_cfg(gamma=1.5))
    cfg = _cfg(kl_coef=0.0, beta=0.0)
    assert cfg.ppo and not cfg.needs_reference
    assert _cfg().needs_reference  # kl_coef defaults to TRL's 0.05
    out = cli("train", "--help-config")
    assert out.returncode == 0, out.stderr
    for key in ("critic.model_path", "critic.vf_coef", "critic.cliprange_value", "loss.kl_coef", "loss.gamma",
                "loss.lam", "loss.whiten_rewards", "loss.whiten_advantages"):
        assert key in out.stdout, key


# --- the critic's gradients -------------------------------------------------------------------------------


def _update_batch(policy, rows=4, T=5):
    from slimgrpo.update import UpdateBatch

    g = torch.Generator().manual_seed(0)
    vocab = policy.model.get_input_embeddings().weight.shape[0] if hasattr(policy.model, "get_input_embeddings") \
        else 100
    prompt = torch.randint(3, vocab, (rows, 3), generator=g)
    comp = torch.randint(3, vocab, (rows, T), generator=g)
    am = torch.ones(rows, 3 + T, dtype=torch.long)
    am[1, 3 + 3:] = 0  # a shorter completion
    mask = am[:, 3:].bool()
    batch = UpdateBatch(torch.cat([prompt, comp], 1), am, comp, mask, torch.randn(rows, T, generator=g))
    batch = dataclasses.replace(batch, old_values=torch.randn(rows, T, generator=g),
                                returns=torch.randn(rows, T, generator=g))
    return batch


def test_lora_critic_gradients_reach_only_its_adapter_and_head(tiny_model_dir):
    from slimgrpo.modeling import build_policy
    from slimgrpo.update.critic import build_critic

    cfg = _cfg()
    cfg.model.path = str(tiny_model_dir)
    cfg.run.device = "cpu"
    cfg.lora.enabled = True
    policy = build_policy(cfg)
    critic = build_critic(cfg, policy)
    named = dict(policy.model.named_parameters())
    critic_ids = {id(p) for p in critic.parameters()}
    policy_ids = {id(p) for p in policy.trainable_parameters()}
    assert critic_ids.isdisjoint(policy_ids) and policy_ids and len(critic_ids) > 2
    assert all(".critic." in n for n, p in named.items() if id(p) in critic_ids)
    assert all(".default." in n for n, p in named.items() if id(p) in policy_ids)
    # the critic's output is not the policy's: a second adapter (B = 0 at init, so nudge it)
    with torch.no_grad():
        for n, p in named.items():
            if ".critic." in n and "lora_B" in n:
                p.normal_(0, 0.1)
    batch = _update_batch(policy)
    stats = critic.accumulate(batch, UpdateSettings(micro_rows=3), batch_totals(batch, SINGLE), vf_coef=1.0,
                              cliprange_value=0.2)
    assert stats["value/loss"] > 0
    for n, p in named.items():
        if id(p) in critic_ids:
            assert p.grad is not None, n
        else:
            assert p.grad is None, n  # the policy's adapter and the frozen base: untouched by the value loss
    assert all(p.grad is not None for p in critic.head.parameters())
    assert policy.model.active_adapter == "default"  # the policy's adapter is back for generation
    assert all(p.requires_grad for p in critic.parameters()) and all(p.requires_grad for p in
                                                                     policy.trainable_parameters())
    # and the policy's loss leaves the critic alone
    from _update_calls import accumulate_gradients

    for p in critic.parameters():
        p.grad = None
    batch = dataclasses.replace(batch, old_logp=None)
    accumulate_gradients(policy.model, batch, LossSettings(), Normaliser.of(batch.loss_mask), 3, 1.0, 4, None)
    assert all(p.grad is None for p in critic.parameters())
    assert all(p.grad is not None for p in policy.trainable_parameters())


def test_full_finetuning_critic_is_a_second_model(tiny_model_dir):
    from slimgrpo.modeling import build_policy
    from slimgrpo.update.critic import build_critic

    cfg = _cfg()
    cfg.model.path = str(tiny_model_dir)
    cfg.run.device = "cpu"
    policy = build_policy(cfg)
    critic = build_critic(cfg, policy)
    assert critic.backbone is not policy.model
    ids = {id(p) for p in critic.parameters()}
    assert ids.isdisjoint({id(p) for p in policy.trainable_parameters()})
    batch = _update_batch(policy)
    values = critic.batch_values(batch, UpdateSettings(micro_rows=3))
    assert values.shape == batch.returns.shape and not values.any()  # a zero head: every value starts at 0
    critic.accumulate(batch, UpdateSettings(micro_rows=3), batch_totals(batch, SINGLE), 1.0, 0.2)
    assert all(p.grad is None for p in policy.model.parameters())
    state = critic.state_dict()
    critic.load_state_dict(state)
    with pytest.raises(ValueError, match="does not fit"):
        critic.load_state_dict({"head.weight": state["head.weight"]})


# --- planner -----------------------------------------------------------------------------------------------


def test_planner_counts_the_critic():
    from slimgrpo.runspec.run import RunSpec
    from slimgrpo.runspec.cost import lora_num_params
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.runspec.shape import load_shape

    shape = load_shape("qwen2.5-0.5b")
    for lora in (True, False):
        base = RunSpec(device="cuda", lora=lora, beta=0.0)
        ppo = RunSpec(device="cuda", lora=lora, beta=0.0, ppo=True, kl_coef=0.05)
        p0, p1 = plan_memory(shape, base), plan_memory(shape, ppo)
        n = lora_num_params(shape, 16, ("all-linear",)) * 4 if lora else shape.num_params * 2
        head = (shape.hidden + 1) * 4
        name = "critic adapter + value head" if lora else "critic model + value head"
        assert p1.bytes_of(name) == n + head
        assert p1.bytes_of("critic gradients") == n + head
        assert p1.bytes_of("critic optimizer state") == 2 * (n + head)
        assert p1.bytes_of("value buffers") == 4 * base.rows * base.max_completion_length * 4
        assert p1.bytes_of("reference policy") == (0 if lora else shape.num_params * 2)  # kl_coef needs it
        assert p1.peak_bytes > p0.peak_bytes
        assert not any(c.name.startswith("critic") for c in p0.components)


def test_plan_command_shows_the_critic_lines():
    out = cli("plan", "--model", "qwen2.5-0.5b", "lora.enabled=true", "loss.advantage_estimator=gae")
    assert out.returncode == 0, out.stderr
    for line in ("critic adapter", "critic gradients", "critic optimizer state", "value buffers"):
        assert line in out.stdout, line


# --- exact resume -----------------------------------------------------------------------------------------


def _same(a, b) -> list[str]:
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    return [k for k in ta if not torch.equal(ta[k], tb[k])]


def test_ppo_resume_is_bit_identical_with_the_critic(tmp_path, tiny_model_dir):
    """LoRA PPO (critic adapter + head, KL reward, two PPO epochs over two mini-batches) killed in the middle
    of step 4 and resumed from checkpoint 2 ends with the bits of an uninterrupted run."""
    sections = dict(run={"max_steps": 4, "save_steps": 2, "save_total_limit": 2},
                    loss={"advantage_estimator": "gae", "kl_coef": 0.05, "beta": 0.0, "num_iterations": 2,
                          "steps_per_generation": 2},
                    lora={"enabled": True, "r": 4}, optim={"learning_rate": 5e-2})
    ref_cfg = write_run(tmp_path / "ref", tiny_model_dir, **sections)
    cfg = write_run(tmp_path / "killed", tiny_model_dir, **sections)
    reference = start_cli("train", str(ref_cfg))
    out = cli("train", str(cfg), env={"TEST_SIGNAL_AT_CALL": "KILL:4"})
    assert out.returncode == -signal.SIGKILL, out.stderr
    out = cli("train", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "checkpoint-2 at step 2" in out.stderr
    _, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr
    a, b = tmp_path / "ref" / "run" / "checkpoints" / "checkpoint-4", tmp_path / "killed" / "run" / "checkpoints" / \
        "checkpoint-4"
    assert _same(a / "critic.safetensors", b / "critic.safetensors") == []
    assert _same(a / "optimizer.safetensors", b / "optimizer.safetensors") == []  # policy and critic moments
    assert _same(a / "model" / "adapter_model.safetensors", b / "model" / "adapter_model.safetensors") == []
    critic = load_file(str(a / "critic.safetensors"))
    assert any(k.startswith("backbone.") and ".critic." in k for k in critic) and "head.weight" in critic
    assert critic["head.weight"].abs().sum() > 0  # the head trained
    run = tmp_path / "killed" / "run"
    assert numeric_metrics(run) == numeric_metrics(tmp_path / "ref" / "run")
    last = numeric_metrics(run)[-1]
    for key in ("value/loss", "value/explained_variance", "value/clipfrac", "value/mean"):
        assert key in last, key
    state = json.loads((b / "trainer_state.json").read_text())
    assert state["step"] == 4
    out = cli("report", str(run))  # the critic's plot is on the page
    assert out.returncode == 0, out.stderr
    assert (run / "report" / "value.png").is_file()


def test_demo_ppo_config(tmp_path):
    from slimgrpo.commands.demo import demo_config

    cfg, _ = demo_config(str(tmp_path / "out"), [], algorithm="ppo")
    assert cfg.ppo and not cfg.lora.enabled and not cfg.needs_reference  # full FT: the critic is a second model
    assert cfg.loss.num_iterations == 2 and cfg.loss.steps_per_generation == 2
    grpo, _ = demo_config(str(tmp_path / "out"), [])
    assert not grpo.ppo


@pytest.mark.slow
def test_demo_ppo_raises_held_out_accuracy(tmp_path):
    """`slimgrpo demo --algorithm ppo` end to end (about a minute on 2 cores): +15 points or more sampled."""
    from slimgrpo.commands.demo import run_demo

    out = tmp_path / "demo"
    assert run_demo(str(out), [], algorithm="ppo") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_after"] - summary["eval_before"] >= 0.15, summary
    assert "value/explained_variance" in summary and "value/loss" in summary
