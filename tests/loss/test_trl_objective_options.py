"""TRL 1.16 objective options wired through the trainer: each new loss type trains, unscorable rows get
advantage 0, the sequence-level clip ratio and the GSPO warning, disable_dropout, config validation."""

import dataclasses
import json
import logging

import pytest
import torch

from slimgrpo.config import ConfigError
from slimgrpo.config.validate import loss_warnings
from slimgrpo.train.runner import run_training
from run_helpers import write_run
from slimgrpo.config import load_config


def make_config(tmp_path, model_dir, *overrides):
    """Two reward functions (vowels, length) on arithmetic prompts, beta 0 unless overridden."""
    return load_config(write_run(tmp_path, model_dir, loss={"beta": 0.0}), list(overrides))


def _records(tmp_path):
    return [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("overrides", [
    ["loss.loss_type=cispo", "loss.epsilon_high=5.0", "loss.num_iterations=2", "loss.beta=0.04"],
    ["loss.loss_type=sapo", "loss.num_iterations=2"],
    ["loss.loss_type=vespo", "loss.num_iterations=2"],
    ["loss.loss_type=luspo", "loss.importance_sampling_level=sequence", "loss.num_iterations=2"],
    ["loss.top_entropy_quantile=0.2", "memory.micro_batch_size=3", "loss.off_policy_mask_threshold=0.01",
     "loss.num_iterations=2", "loss.multi_objective_aggregation=normalize_then_sum"],
])
def test_new_options_train(tmp_path, tiny_model_dir, overrides):
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=2", "run.save_model=false", *overrides)
    run_training(cfg)
    last = _records(tmp_path)[-1]
    assert last["loss"] is not None and last["grad_norm"] is not None and last["grad_norm"] > 0
    if "loss.loss_type=cispo" in overrides:
        assert 0 <= last["cispo_clip_ratio"] <= 1
    if "loss.loss_type=vespo" in overrides:
        assert last["vespo/phi_seq_mean"] > 0


def test_unscorable_rows_get_zero_advantage(tmp_path, tiny_model_dir):
    """Rows every reward function scores None are left out of the group baseline and get advantage 0."""
    from slimgrpo.train.trainer import Trainer
    from slimgrpo.containers import RewardOutput

    cfg = make_config(tmp_path, tiny_model_dir)
    t = Trainer(cfg)
    nan = float("nan")
    per_fn = torch.tensor([[1.0, nan], [nan, nan], [0.0, 0.5], [2.0, nan]] * 2)
    total = torch.tensor([1.0, nan, 0.5, 2.0] * 2)  # what the runner reports: NaN for the unscorable row
    a = t.compute_advantages(RewardOutput(per_function=per_fn, total=total, names=["a", "b"])).cpu()
    scorable = torch.tensor([1.0, 0.5, 2.0])
    want = (scorable - scorable.mean()) / (scorable.std() + 1e-4)
    torch.testing.assert_close(a[[0, 2, 3]], want)
    assert a[1] == 0 and a[5] == 0


def test_sequence_level_clip_ratio_and_gspo_warning(tmp_path, tiny_model_dir, caplog):
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=1", "run.save_model=false",
                      "loss.importance_sampling_level=sequence", "loss.num_iterations=3", "loss.epsilon=0.001")
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        run_training(cfg)
    assert any("GSPO paper" in r.message and "loss.loss_type=grpo" in r.message for r in caplog.records)
    last = _records(tmp_path)[-1]
    # 8 sequences: each fraction is a multiple of 1/8 (per sequence, not per token)
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert abs(last[key] * 8 - round(last[key] * 8)) < 1e-6, (key, last[key])
    assert last["clip_ratio/region_mean"] > 0  # epsilon=0.001 over 3 iterations: something is clipped
    assert loss_warnings(make_config(tmp_path, tiny_model_dir, "loss.importance_sampling_level=sequence",
                                     "loss.loss_type=grpo")) == []


def test_disable_dropout():
    from slimgrpo.modeling import disable_dropout

    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.3), torch.nn.Sequential(torch.nn.Dropout(0.1)))
    assert disable_dropout(m) == 2
    assert all(mod.p == 0 for mod in m.modules() if isinstance(mod, torch.nn.Dropout))
    x = torch.randn(4, 3)
    m.train()
    torch.testing.assert_close(m(x), m(x))


@pytest.mark.parametrize("override, word", [
    ("loss.loss_type=cispo", "epsilon_high"),
    ("loss.top_entropy_quantile=1.5", "top_entropy_quantile"),
    ("loss.off_policy_mask_threshold=-1", "off_policy_mask_threshold"),
    ("loss.sapo_temperature_neg=0", "sapo_temperature_neg"),
    ("loss.vespo_k_pos=-1", "vespo_k_pos"),
])
def test_config_validation(tmp_path, tiny_model_dir, override, word):
    with pytest.raises(ConfigError, match=word):
        make_config(tmp_path, tiny_model_dir, override)


def test_normalize_then_sum_refuses_rloo(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="rloo"):
        make_config(tmp_path, tiny_model_dir, "loss.multi_objective_aggregation=normalize_then_sum",
                    "loss.advantage_estimator=rloo")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batched_clip_stats_equal_whole_batch(monkeypatch, level):
    """accumulate_gradients weights each micro-batch's clip fractions by what they average over (tokens, or
    sequences at sequence level), so micro-batching leaves the logged values unchanged; the top-entropy cut
    of the whole batch is used in every micro-batch."""
    from slimgrpo.loss.objectives import LossSettings, Normaliser, TokenEntropy, grpo_loss
    from slimgrpo.loss.policy_losses import entropy_threshold
    import _update_calls as update

    g = torch.Generator().manual_seed(0)
    rows, T = 5, 7
    lengths = torch.tensor([7, 2, 5, 1, 6])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp_all = (-2.0 + 0.5 * torch.randn(rows, T, generator=g)).requires_grad_()
    ent_all = torch.rand(rows, T, generator=g) * 3
    old = logp_all.detach() + 0.4 * torch.randn(rows, T, generator=g)
    adv = torch.tensor([1.0, -0.5, -1.0, 0.7, 0.2])
    batch = update.UpdateBatch(input_ids=torch.ones(rows, 2 + T, dtype=torch.long),
                               attention_mask=torch.cat([torch.ones(rows, 2), mask.long()], 1).long(),
                               completion_ids=torch.ones(rows, T, dtype=torch.long), loss_mask=mask,
                               advantages=adv, old_logp=old)
    batch = dataclasses.replace(batch, entropy_cut=entropy_threshold(ent_all, mask, 0.5))
    calls = []

    def fake_logprobs(model, rows, **kw):  # rows are found by their all-ones prompt: use order
        ids, t = rows.input_ids, rows.T
        start = sum(calls)
        calls.append(ids.shape[0])
        return logp_all[start:start + ids.shape[0], :t], ent_all[start:start + ids.shape[0], :t]

    from slimgrpo.update import micro_loss

    monkeypatch.setattr(micro_loss, "completion_logprobs", fake_logprobs)  # the update's log-prob call
    s = LossSettings(importance_sampling_level=level, epsilon=0.05, top_entropy_quantile=0.5)
    norm = Normaliser.of(mask)
    st = update.accumulate_gradients(None, batch, s, norm, micro=2, temperature=1.0, token_chunk=16,
                                     vocab_chunk=None)
    _, whole = grpo_loss(logp_all, old, None, adv, mask, s, norm, entropy=TokenEntropy(ent_all, cut=batch.entropy_cut))
    assert calls == [2, 2, 1]
    assert st.clip_count == whole.clip_count == (rows if level == "sequence" else int(mask.sum()))
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_region"):
        assert getattr(st, key) == pytest.approx(getattr(whole, key)), key
    assert st.clip_ratio_region > 0


def test_steps_per_generation_slices_the_batch(tmp_path, tiny_model_dir, monkeypatch):
    """One generation of 8 completions, 2 slices x 2 iterations = 4 optimizer steps on 4-row slices, each
    with its own normaliser, all against the old log-probs taken once after generation."""
    from slimgrpo.update import updater as trainer_mod

    seen = []
    real = trainer_mod.accumulate_gradients

    def spy(model, part, settings, norm, *args, **kw):
        seen.append((part.rows, norm.num_sequences, part.old_logp is not None,
                     float(part.advantages.abs().sum())))
        return real(model, part, settings, norm, *args, **kw)

    monkeypatch.setattr(trainer_mod, "accumulate_gradients", spy)
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=1", "run.save_model=false",
                      "loss.steps_per_generation=2", "loss.num_iterations=2")
    run_training(cfg)
    assert [s[:3] for s in seen] == [(4, 4, True)] * 4
    assert seen[0][3] == seen[2][3] and seen[1][3] == seen[3][3]  # iteration 2 revisits the same slices
    last = _records(tmp_path)[-1]
    assert last["grad_norm"] is not None
    with pytest.raises(ConfigError, match="steps_per_generation"):
        make_config(tmp_path, tiny_model_dir, "loss.steps_per_generation=3")


def test_sync_reference_mixes_weights(tmp_path, tiny_model_dir):
    from slimgrpo.modeling import build_policy

    cfg = make_config(tmp_path, tiny_model_dir, "loss.beta=0.04", "loss.sync_ref_model=true")
    policy = build_policy(cfg)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.5)
    before = {k: v.clone() for k, v in policy.reference_cpu.named_parameters()}
    policy.sync_reference(0.25)
    for name, p in policy.model.named_parameters():
        want = 0.25 * p.detach() + 0.75 * before[name]
        torch.testing.assert_close(dict(policy.reference_cpu.named_parameters())[name], want)


def test_sync_ref_model_every_n_optimizer_steps(tmp_path, tiny_model_dir, monkeypatch):
    from slimgrpo.modeling import Policy

    calls = []
    monkeypatch.setattr(Policy, "sync_reference", lambda self, alpha: calls.append(alpha))
    cfg = make_config(tmp_path, tiny_model_dir, "run.max_steps=3", "run.save_model=false", "loss.beta=0.04",
                      "loss.sync_ref_model=true", "loss.ref_model_sync_steps=4", "loss.num_iterations=2",
                      "loss.ref_model_mixup_alpha=0.3")
    run_training(cfg)
    assert calls == [0.3]  # 6 optimizer steps: a sync after the 4th


@pytest.mark.parametrize("overrides, word", [
    (["loss.sync_ref_model=true"], "beta"),
    (["loss.sync_ref_model=true", "loss.beta=0.1", "lora.enabled=true"], "LoRA"),
    (["loss.sync_ref_model=true", "loss.beta=0.1", "loss.ref_model_mixup_alpha=2"], "ref_model_mixup_alpha"),
])
def test_sync_ref_model_validation(tmp_path, tiny_model_dir, overrides, word):
    with pytest.raises(ConfigError, match=word):
        make_config(tmp_path, tiny_model_dir, *overrides)
