"""What a TRL script may rely on that TRL's own tests/test_grpo_trainer.py showed slimgrpo.trl lacking
(benchmarks/trl_tests): reward models named as on the hub, the last ``log_history`` entry, the refusals' messages,
an environment that owns the data, evaluation sets given by name or at ``evaluate()``, streamed datasets,
``chat_template_kwargs``, the ``policy_loss`` metric, the adaptive ``entropy_coef``, TRL's mask helpers and rewards
that are never applicable. Tiny models built in code, a few steps each."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from slimgrpo.trl import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
SETTINGS = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=3,
                learning_rate=1e-3, seed=7, logging_steps=1, use_cpu=True, bf16=False, report_to="none")


def digits(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # plain or conversational
    return [float(sum(ch.isdigit() for ch in t)) / 10 for t in texts]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _args(workdir: Path, output: str, **extra) -> GRPOConfig:
    return GRPOConfig(output_dir=str(workdir / output), **{**SETTINGS, **extra})


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def hub_reward_model(tmp_path, monkeypatch):
    """A sequence-classification model under the hub cache's layout as ``org/tiny-reward``, the hub off."""
    import huggingface_hub.constants as hub
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    from tiny_models import build_tokenizer

    repo = tmp_path / "hub" / "models--org--tiny-reward"
    snapshot = repo / "snapshots" / "0"
    snapshot.mkdir(parents=True)
    tok = build_tokenizer(snapshot)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(str(snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return "org/tiny-reward"


def test_a_reward_model_named_as_on_the_hub(workdir, tiny_chat_model_dir, hub_reward_model):
    """TRL loads every string of reward_funcs with AutoModelForSequenceClassification: a hub name (here from the
    local cache) is a reward model, named after its last part, with its tokenizer beside it."""
    from transformers import PreTrainedModel

    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=[hub_reward_model, digits],
                          args=_args(workdir, "rm", max_steps=1, reward_weights=[0.5, 2.0]), train_dataset=ROWS)
    assert trainer.reward_func_names == ["tiny-reward", "digits"]
    assert isinstance(trainer.reward_funcs[0], PreTrainedModel) and trainer.reward_funcs[1] is digits
    assert len(trainer.reward_processing_classes) == 2 and trainer.reward_processing_classes[1] is None
    assert trainer.reward_weights.tolist() == [0.5, 2.0]
    assert trainer.aux_loss_enabled is False  # slimgrpo adds no MoE router loss
    trainer.train()
    assert "rewards/tiny-reward/mean" in trainer.state.log_history[0]
    with pytest.raises(ValueError, match=r"number of reward processing classes \(1\) must match"):
        GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=[hub_reward_model, digits],
                    reward_processing_classes=trainer.processing_class, args=_args(workdir, "bad"),
                    train_dataset=ROWS)


def test_log_history_means_the_steps_since_the_last_log_and_the_last_entry_keeps_the_rest(workdir,
                                                                                          tiny_chat_model_dir):
    """As TRL's log(): an entry every logging_steps steps holds each metric's mean over those steps (grad_norm and
    learning_rate as at the step), and the final entry (train_loss, train_runtime) carries the metrics of the
    steps after the last log."""
    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                          args=_args(workdir, "logs", logging_steps=2))
    trainer.train()
    rows = _metrics(workdir / "logs")
    history = trainer.state.log_history
    assert [h["step"] for h in history] == [2, 3]
    assert history[0]["reward"] == pytest.approx((rows[0]["reward"] + rows[1]["reward"]) / 2)
    assert history[0]["grad_norm"] == pytest.approx(rows[1]["grad_norm"])
    last = history[-1]
    assert last["train_loss"] is not None and last["rewards/digits/mean"] == pytest.approx(rows[2]["reward"])
    assert "loss" not in last and "grad_norm" not in last


def test_refusals_say_what_trl_says(workdir, tiny_chat_model_dir):
    model = str(tiny_chat_model_dir)
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(model=model, args=_args(workdir, "a"), train_dataset=ROWS)
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer(model=model, reward_funcs=digits, args=_args(workdir, "b"))

    class Env:
        def reset(self, **kwargs):
            return "Guess."

    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        GRPOTrainer(model=model, reward_funcs=digits, args=_args(workdir, "c"),
                    environment_factory={"a": Env, "b": Env})
    with pytest.raises(ValueError, match="`max_steps` must be set"):
        GRPOTrainer(model=model, reward_funcs=digits, args=_args(workdir, "d", max_steps=-1),
                    environment_factory=Env)


def test_an_environment_that_owns_the_data_and_the_reward(workdir, tiny_chat_model_dir):
    """TRL 1.16: no train_dataset, the environment's reset() gives the prompt and max_steps the length; its
    get_reward is a reward function named after its class, after the script's (weight 1); its public methods are
    the trainer's tools."""
    seen = []

    class GuessEnvironment:
        def reset(self, **kwargs):
            seen.append(kwargs)
            return "Guess a number."

        def guess(self, number: int) -> str:
            """
            Submit a guess.

            Args:
                number: The guessed number.
            """
            return "nope"

        def get_reward(self) -> float:
            return 1.0

    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, environment_factory=GuessEnvironment,
                          args=_args(workdir, "env", max_steps=2, reward_weights=[0.5]))
    assert trainer.reward_func_names == ["digits", "GuessEnvironment"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0] and len(trainer.reward_funcs) == 2
    assert [t.__name__ for t in trainer.tools] == ["guess"]
    trainer.train()
    assert trainer.state.global_step == 2 and seen
    assert trainer.state.log_history[0]["rewards/GuessEnvironment/mean"] == pytest.approx(1.0)


def test_evaluation_sets_by_name_and_at_evaluate(workdir, tiny_chat_model_dir):
    """eval_dataset as a dict (or DatasetDict) of named sets: each evaluated apart, logged eval_<name>_...;
    evaluate(eval_dataset=...) evaluates a set (or named sets) given at the call."""
    from datasets import Dataset, DatasetDict

    held_out = Dataset.from_list(ROWS[:4])
    named = DatasetDict({"easy": held_out, "hard": Dataset.from_list(ROWS[4:8])})
    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                          eval_dataset=named, args=_args(workdir, "eval", max_steps=2, eval_strategy="steps",
                                                         eval_steps=1))
    assert trainer.eval_dataset is named
    trainer.train()
    evaluated = [h for h in trainer.state.log_history if "eval_easy_mean_reward" in h]
    assert len(evaluated) >= 2 and all("eval_hard_mean_reward" in h for h in evaluated)
    one = trainer.evaluate(eval_dataset=held_out)
    assert {"eval_accuracy_greedy", "eval_mean_reward", "eval_rewards_digits"} <= set(one)
    both = trainer.evaluate(eval_dataset={"a": held_out, "b": held_out}, metric_key_prefix="test")
    assert both["test_a_mean_reward"] == pytest.approx(both["test_b_mean_reward"])


def test_streamed_datasets(workdir, tiny_chat_model_dir):
    """An IterableDataset (load_dataset(..., streaming=True)) trains for max_steps, read as far as those steps
    take it, and is refused without max_steps, as transformers refuses it; a streamed evaluation set is read
    whole."""
    from datasets import Dataset

    stream = Dataset.from_list(ROWS).to_iterable_dataset()
    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=stream,
                          eval_dataset=Dataset.from_list(ROWS[:2]).to_iterable_dataset(),
                          args=_args(workdir, "stream", max_steps=2))
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.evaluate()["eval_mean_reward"] >= 0.0
    with pytest.raises(ValueError, match="max_steps has to be specified"):
        GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=stream,
                    args=_args(workdir, "stream2", max_steps=-1))


def test_chat_template_kwargs_reach_the_template(workdir, tiny_chat_model_dir):
    """chat_template_kwargs (Qwen3's enable_thinking=False) are passed to the chat template of every prompt."""
    from transformers import AutoTokenizer

    from slimgrpo.data import prompt_to_text
    from slimgrpo.trl.grpo import run_config

    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model_dir))
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not "
                         "enable_thinking %}<no-think>{% endif %}{% endif %}")
    cfg = run_config(_args(workdir, "tpl", chat_template_kwargs={"enable_thinking": False}),
                     str(tiny_chat_model_dir), [digits], datasets=(ROWS, None))
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    prompt = [{"role": "user", "content": "hi"}]
    assert prompt_to_text(prompt, tok, cfg.data)[0].endswith("<assistant><no-think>")
    cfg.data.chat_template_kwargs = None
    assert prompt_to_text(prompt, tok, cfg.data)[0].endswith("<assistant>")


def test_policy_loss_is_logged_with_the_entropy_bonus(workdir, tiny_chat_model_dir):
    """With entropy_coef set, TRL logs policy_loss (the loss without the bonus): loss = policy_loss - coef * H,
    H the mean token entropy (logged as entropy)."""
    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                          args=_args(workdir, "ent", max_steps=2, entropy_coef=0.5))
    trainer.train()
    steps = [h for h in trainer.state.log_history if "policy_loss" in h]
    assert len(steps) == 2
    for h in steps:
        assert math.isfinite(h["policy_loss"]) and h["entropy"] > 0
        assert (h["policy_loss"] - h["loss"]) / h["entropy"] == pytest.approx(0.5, rel=1e-3)
    plain = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                        args=_args(workdir, "plain", max_steps=1))
    plain.train()
    assert all("policy_loss" not in h for h in plain.state.log_history)


def test_a_model_without_sdpa_attention_loads_with_transformers_choice(tmp_path):
    """GPT-OSS has no SDPA attention: slimgrpo's default model.attn_implementation=sdpa falls back to what
    transformers picks instead of refusing the model."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no GPT-OSS")
    from slimgrpo.config import ModelConfig
    from slimgrpo.modeling import load_model

    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_local_experts=2,
                                    num_experts_per_tok=1, layer_types=["full_attention"])
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(tmp_path))
    model = load_model(ModelConfig(path=str(tmp_path), attn_implementation="sdpa"), torch.device("cpu"),
                       torch.float32)
    assert model.config._attn_implementation != "sdpa"


def test_adaptive_entropy_coef_is_the_trainers_attribute(workdir, tiny_chat_model_dir):
    """trainer.entropy_coef: the coefficient after the adaptive controller's steps (TRL's attribute); with a
    target above any entropy the controller raises it every step."""
    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                          args=_args(workdir, "adaptive", max_steps=2, entropy_coef=0.01, use_adaptive_entropy=True,
                                     entropy_target=1e3))
    assert trainer.entropy_coef == pytest.approx(0.01)
    trainer.train()
    assert trainer.entropy_coef > 0.01
    assert trainer.state.log_history[-2]["entropy_coef"] == pytest.approx(trainer.entropy_coef)


def test_trls_mask_helpers_match_a_naive_reference():
    """GRPOTrainer.get_high_entropy_mask / get_off_policy_mask (TRL's public helpers) on shapes that are not
    round, against a loop written out here."""
    torch.manual_seed(3)
    entropies, mask = torch.rand(3, 7), (torch.rand(3, 7) > 0.3).int()
    for threshold in (0.0, 0.35, 0.8, 1.0):
        got = GRPOTrainer.get_high_entropy_mask(None, entropies, mask, threshold)
        kept = sorted(float(e) for e, m in zip(entropies.flatten(), mask.flatten()) if m)
        pos = threshold * (len(kept) - 1)  # linear interpolation, as torch.quantile
        lo = kept[int(pos)]
        cut = lo + (kept[min(int(pos) + 1, len(kept) - 1)] - lo) * (pos - int(pos))
        want = torch.tensor([[bool(m) and float(e) >= cut for e, m in zip(er, mr)] for er, mr in zip(entropies, mask)])
        assert torch.equal(got, want), threshold
    assert not GRPOTrainer.get_high_entropy_mask(None, entropies, mask * 0, 0.5).any()

    logps, sampling = -torch.rand(4, 5) * 3, -torch.rand(4, 5)
    mask, advantages = (torch.rand(4, 5) > 0.2).float(), torch.tensor([0.5, -1.0, -0.2, 0.0])
    got = GRPOTrainer.get_off_policy_mask(advantages.unsqueeze(-1), logps, sampling, mask, 0.6)
    want = []
    for i in range(4):
        kl = [float(sampling[i, t] - logps[i, t]) for t in range(5) if mask[i, t]]
        want.append([1.0 if advantages[i] >= 0 or sum(kl) / max(len(kl), 1) <= 0.6 else 0.0])
    assert got.tolist() == want


def test_a_reward_that_is_never_applicable_does_not_stop_the_run(workdir, tiny_chat_model_dir):
    """TRL: None is 'not applicable'; a function returning None for every completion for many steps does not stop
    training (a slimgrpo YAML stops after rewards.max_failed_steps such steps)."""
    def never(completions, **kwargs):
        return [None] * len(completions)

    trainer = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=[digits, never], train_dataset=ROWS,
                          args=_args(workdir, "never", max_steps=3))
    assert trainer._loop.cfg.rewards.max_failed_steps == 0
    trainer.train()
    assert trainer.state.global_step == 3


def test_tool_prompts_are_not_cut_at_the_default_bound(workdir, tiny_chat_model_dir):
    """With tools or an environment and no max_prompt_length, the bound is what max_completion_length leaves of
    the model's context (TRL 1.16 does not cut prompts; the tools' schemas ride on every prompt); without tools
    slimgrpo's 512 stays (TRL 1.16's GRPOConfig has no max_prompt_length to set)."""
    import json as _json
    import shutil

    from slimgrpo.trl.grpo import run_config

    model = workdir / "long-context"
    shutil.copytree(tiny_chat_model_dir, model)
    config = _json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (model / "config.json").write_text(_json.dumps(config))
    with_tools = run_config(_args(workdir, "t1"), str(model), [digits], datasets=(ROWS, None), tools_given=True)
    assert with_tools.data.max_prompt_length == 4096 - 8
    plain = run_config(_args(workdir, "t2"), str(model), [digits], datasets=(ROWS, None))
    assert plain.data.max_prompt_length == 512


def test_tool_metrics_carry_trls_names():
    """A script's log_history has TRL's tools/call_frequency (tool calls per completion: TRL divides the calls by
    the completions) beside slimgrpo's tools/calls_per_completion; slimgrpo's own prefixes stay out."""
    from slimgrpo.trl.callbacks import trl_logs

    logs = trl_logs({"step": 3, "tools/calls_per_completion": 0.75, "tools/failure_frequency": 0.5,
                     "time/step_s": 2.0, "memory/peak_rss_mib": 10.0}, 0.5)
    assert logs == {"tools/calls_per_completion": 0.75, "tools/call_frequency": 0.75,
                    "tools/failure_frequency": 0.5, "step_time": 2.0, "epoch": 0.5}
