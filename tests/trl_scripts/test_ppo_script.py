"""TRL's ``examples/scripts/ppo/ppo.py`` with its imports changed to ``slimgrpo.trl``: the script parses its
arguments with ``HfArgumentParser``, loads a policy, a reference, a reward and a value model (tiny ones built
here, in folders, as the script loads them), pre-tokenizes its prompts and trains with ``PPOTrainer``, with full
fine-tuning and with ``--use_peft``; what slimgrpo cannot honour is refused naming it. Every PPOConfig and
GRPOConfig field has a rule in the table, which is checked without trl."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slimgrpo.config.trl_table import BY_KEY
from slimgrpo.trl import PPOConfig, PPOTrainer, convert

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = [f"What is {a} plus {b}?" for a in range(1, 7) for b in range(1, 5)]
SCRIPT = textwrap.dedent('''\
    import sys

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, HfArgumentParser

    from slimgrpo.trl import ModelConfig, PPOConfig, PPOTrainer, ScriptArguments, get_peft_config, \\
        get_quantization_config


    def main(argv):
        parser = HfArgumentParser((ScriptArguments, PPOConfig, ModelConfig))
        script_args, training_args, model_args = parser.parse_args_into_dataclasses(argv)
        model_kwargs = dict(revision=model_args.model_revision, attn_implementation=model_args.attn_implementation)
        quantization_config = get_quantization_config(model_args)
        if quantization_config is not None:
            model_kwargs["quantization_config"] = quantization_config
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
        tokenizer.add_special_tokens({"pad_token": "[PAD]"})
        value_model = AutoModelForSequenceClassification.from_pretrained(training_args.reward_model_path,
                                                                         num_labels=1, **model_kwargs)
        reward_model = AutoModelForSequenceClassification.from_pretrained(training_args.reward_model_path,
                                                                          num_labels=1, **model_kwargs)
        policy = AutoModelForCausalLM.from_pretrained(training_args.sft_model_path, **model_kwargs)
        peft_config = get_peft_config(model_args)
        if peft_config is None:
            ref_policy = AutoModelForCausalLM.from_pretrained(training_args.sft_model_path, **model_kwargs)
        else:
            ref_policy = None
        dataset = Dataset.from_json(script_args.dataset_name)
        eval_samples = 4
        train_dataset = dataset.select(range(len(dataset) - eval_samples))
        eval_dataset = dataset.select(range(len(dataset) - eval_samples, len(dataset)))

        def prepare_dataset(dataset, tokenizer):
            def tokenize(element):
                outputs = tokenizer(element["prompt"], padding=False)
                return {"input_ids": outputs["input_ids"]}

            return dataset.map(tokenize, batched=True, remove_columns=dataset.column_names,
                               num_proc=training_args.dataset_num_proc)

        train_dataset = prepare_dataset(train_dataset, tokenizer)
        eval_dataset = prepare_dataset(eval_dataset, tokenizer)
        trainer = PPOTrainer(args=training_args, processing_class=tokenizer, model=policy, ref_model=ref_policy,
                             reward_model=reward_model, value_model=value_model, train_dataset=train_dataset,
                             eval_dataset=eval_dataset, peft_config=peft_config)
        trainer.train()
        trainer.save_model(training_args.output_dir)
        trainer.generate_completions()
        return trainer


    if __name__ == "__main__":
        main(sys.argv[1:])
''')
TRL_PPO_NAMES = ("objective/kl", "objective/non_score_reward", "objective/rlhf_reward", "objective/scores",
                 "loss/policy_avg", "loss/value_avg", "val/clipfrac_avg", "policy/clipfrac_avg",
                 "policy/entropy_avg", "val/num_eos_tokens", "lr", "episode", "eps", "epoch")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """``policy/`` (a tiny Qwen2 and its tokenizer, the vocabulary exactly the tokenizer's, so ppo.py's added
    ``[PAD]`` lies outside it as in GPT-2's case) and ``reward/`` (a tiny Qwen2 sequence classifier, one
    label, the same tokenizer), built in code."""
    from tiny_models import build_tiny_model, build_tokenizer
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    root = tmp_path_factory.mktemp("ppo_models")
    tok = build_tokenizer(root / "policy")
    build_tiny_model(root / "policy", vocab_size=len(tok))
    tok.save_pretrained(str(root / "reward"))
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0, eos_token_id=1,
                      bos_token_id=2)
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(str(root / "reward"))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": w}) + "\n" for w in WORDS))
    return root


@pytest.fixture(scope="module")
def script(models):
    (models / "ppo.py").write_text(SCRIPT)
    sys.path.insert(0, str(models))
    import ppo as module  # noqa: PLC0415 - the script file written above

    yield module
    sys.path.remove(str(models))
    sys.modules.pop("ppo", None)


def _argv(models: Path, out: Path, *extra: str) -> list[str]:
    return ["--dataset_name", str(models / "prompts.jsonl"), "--model_name_or_path", str(models / "policy"),
            "--sft_model_path", str(models / "policy"), "--reward_model_path", str(models / "reward"),
            "--output_dir", str(out), "--per_device_train_batch_size", "4", "--total_episodes", "8",
            "--response_length", "6", "--num_ppo_epochs", "2", "--learning_rate", "1e-3",
            "--missing_eos_penalty", "1.0", "--use_cpu", "--bf16", "false", "--report_to", "none",
            "--seed", "3", *extra]


def _policy_weights(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


# ------------------------------------------------------------------------------------------- the script


def test_ppo_script_full_fine_tuning(script, models, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    start = {n: p.detach().clone() for n, p in AutoModelForCausalLM.from_pretrained(
        str(models / "policy")).named_parameters()}
    trainer = script.main(_argv(models, tmp_path / "out"))
    assert trainer.state.global_step == 2  # total_episodes 8 / 4 completions a rollout
    assert all(not torch.equal(p, start[n]) for n, p in trainer.model.named_parameters()), "the policy moved"
    steps = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert [h["step"] for h in steps] == [1, 2]  # every rollout is logged, as TRL's PPO logs it
    for name in TRL_PPO_NAMES + ("reward", "value/loss", "value/clipfrac", "loss"):  # TRL's and slimgrpo's
        assert name in steps[-1], name
    assert steps[-1]["episode"] == 8 and steps[-1]["loss/value_avg"] == steps[-1]["value/loss"]
    assert steps[-1]["objective/rlhf_reward"] == pytest.approx(
        steps[-1]["objective/scores"] + steps[-1]["objective/non_score_reward"])
    # the critic is the script's value model: its decoder and score head, trained in place
    critic = trainer._loop.critic
    assert critic.head is trainer.value_model.score and critic.backbone is trainer.value_model.base_model
    # its value of completion token t is the score head on the hidden state that predicts it, as TRL reads
    # full_value[:, context_length - 1 : -1]
    ids, completion = torch.tensor([[5, 6, 7, 20, 21, 1]]), torch.tensor([[20, 21, 1]])
    with torch.no_grad():
        got = critic.values(ids, torch.ones_like(ids), completion)
        hidden = trainer.value_model.base_model(input_ids=ids)[0]
        assert torch.allclose(got[0], trainer.value_model.score(hidden[0, 2:5]).squeeze(-1), atol=1e-5)
    assert trainer.ref_model is not None  # full fine-tuning with kl_coef > 0: slimgrpo's own reference copy
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()
    table = capsys.readouterr().out
    assert "model response" in table and "What is 6 plus" in table  # generate_completions on the eval set
    with pytest.raises(RuntimeError, match="never uploads"):
        trainer.push_to_hub()


def test_ppo_script_with_peft(script, models, tmp_path):
    trainer = script.main(_argv(models, tmp_path / "out", "--use_peft", "--lora_r", "8", "--lora_alpha", "16",
                                "--lora_target_modules", "q_proj", "v_proj"))
    assert trainer.state.global_step == 2
    critic = trainer._loop.critic
    assert critic.adapter == "critic" and trainer.ref_model is None  # one copy: adapters for both, base as ref
    assert all(not p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)
    steps = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert {name for name in TRL_PPO_NAMES} <= set(steps[-1])
    saved = tmp_path / "out"
    assert (saved / "adapter_model.safetensors").is_file() and not (saved / "critic").exists()  # the policy only


def test_peft_adapters_move_and_the_base_does_not(models, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models / "policy"), padding_side="left")
    rows = Dataset.from_list([{"input_ids": tok(w)["input_ids"]} for w in WORDS])
    policy = AutoModelForCausalLM.from_pretrained(str(models / "policy"))
    reward = AutoModelForSequenceClassification.from_pretrained(str(models / "reward"), num_labels=1)
    trainer = PPOTrainer(args=_args(tmp_path, num_ppo_epochs=2), processing_class=tok, model=policy,
                         ref_model=None, reward_model=reward, value_model=None, train_dataset=rows,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    before = _policy_weights(trainer)
    trainer.train()
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    # both adapters (the critic's once its zero value head has moved) and nothing of the base
    assert {n for n in moved if ".default." in n} and {n for n in moved if ".critic." in n}
    assert all("lora_" in n for n in moved), moved


def _args(tmp_path: Path, **extra) -> PPOConfig:
    settings = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, total_episodes=8,
                    response_length=6, num_ppo_epochs=1, learning_rate=1e-3, use_cpu=True, bf16=False,
                    report_to="none", seed=3)
    return PPOConfig(**{**settings, **extra})


# ------------------------------------------------------------------------------------------- pieces


def test_the_reward_model_scores_prompt_and_completion_ids_as_trl(models):
    """TRL's ``get_reward`` reads the score head at the last real token of query + response: the same as the
    model run on each row alone, whatever the other rows' lengths; a completion without EOS loses the
    penalty."""
    from transformers import AutoModelForSequenceClassification

    from slimgrpo.trl.ppo import PPOScore

    reward = AutoModelForSequenceClassification.from_pretrained(str(models / "reward"), num_labels=1)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    completions = [[20, 21, 1], [22], [23, 24, 25, 26]]  # 1 is the EOS id
    score = PPOScore(reward, eos_token_id=1, missing_eos_penalty=2.0, device=torch.device("cpu"), batch_rows=2)
    with torch.no_grad():
        alone = [float(reward(input_ids=torch.tensor([p + c])).logits[0, 0]) for p, c in zip(prompts, completions)]
    assert score.scores(prompts, completions) == pytest.approx(alone, abs=1e-5)
    logged = {}
    got = score(["a"] * 3, ["b"] * 3, completions, input_ids=prompts, log_metric=logged.__setitem__)
    assert got == pytest.approx([alone[0], alone[1] - 2.0, alone[2] - 2.0], abs=1e-5)
    assert logged == {"val/num_eos_tokens": 1}


def test_token_id_prompts_are_used_as_given(models):
    """A prompt column of token ids (data.py): the ids as they are, no chat template, no re-encode; the prompt
    text is their decoding and the column stays (after data.max_prompt_length)."""
    from transformers import AutoTokenizer

    from slimgrpo.config import DataConfig
    from slimgrpo.data import DataError, build_dataset

    tok = AutoTokenizer.from_pretrained(str(models / "policy"))
    ids = [tok.convert_tokens_to_ids(ch) for ch in "What"]  # one token per letter: re-encoding would merge them
    assert tok(tok.decode(ids))["input_ids"] != ids
    rows = [{"input_ids": ids, "gold": "x"}, {"input_ids": ids + ids, "gold": "y"}]
    ds = build_dataset(rows, tok, DataConfig(prompt_column="input_ids", max_prompt_length=6))
    assert ds.prompt_ids == [ids, (ids + ids)[-6:]] and ds.prompts == ["What", tok.decode((ids + ids)[-6:])]
    assert ds.columns == {"input_ids": [ids, (ids + ids)[-6:]], "gold": ["x", "y"]}
    with pytest.raises(DataError, match="row 2: column 'input_ids' must hold token ids"):
        build_dataset([{"input_ids": ids}, {"input_ids": "What"}], tok, DataConfig(prompt_column="input_ids"))


def test_a_prompt_text_column_is_tokenized_as_ppo_py_does(models):
    from transformers import AutoTokenizer

    from slimgrpo.trl.ppo import token_rows

    tok = AutoTokenizer.from_pretrained(str(models / "policy"))
    rows = token_rows([{"prompt": "What is 1 plus 2?", "gold": "3"}], tok, "train_dataset")
    assert rows == [{"gold": "3", "input_ids": tok("What is 1 plus 2?")["input_ids"]}]


def test_bad_input_is_refused_naming_it(models, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models / "policy"))
    policy = AutoModelForCausalLM.from_pretrained(str(models / "policy"))
    reward = AutoModelForSequenceClassification.from_pretrained(str(models / "reward"), num_labels=1)
    rows = Dataset.from_list([{"input_ids": tok(w)["input_ids"]} for w in WORDS])

    def make(args=None, **given):
        kw = dict(args=args or _args(tmp_path), processing_class=tok, model=policy, ref_model=None,
                  reward_model=reward, value_model=reward, train_dataset=rows)
        return PPOTrainer(**{**kw, **given})

    with pytest.raises(ValueError, match=r"optimizers=\.\.\.\): slimgrpo builds one AdamW"):
        make(optimizers=(torch.optim.SGD(policy.parameters(), lr=0.1), None))
    with pytest.raises(ValueError, match=r"train_dataset=\.\.\.\).*'input_ids'.*has \['query', 'text'\]"):
        make(train_dataset=Dataset.from_list([{"query": "a", "text": "b"}]))
    with pytest.raises(ValueError, match=r"kl_estimator='k3'\): slimgrpo cannot honour it: slimgrpo's KL reward "
                                         r"is k1"):
        _args(tmp_path, kl_estimator="k3")  # on the PPOConfig(...) line, as GRPOConfig refuses
    with pytest.raises(ValueError, match=r"model_adapter_name='policy'\)"):
        make(args=_args(tmp_path, model_adapter_name="policy"))
    with pytest.raises(ValueError, match="stop_token and stop_token_id are both set"):
        make(args=_args(tmp_path, stop_token="eos", stop_token_id=1))
    with pytest.raises(ValueError, match="model and ref_model cannot be the same object"):
        make(ref_model=policy)
    other = AutoModelForCausalLM.from_pretrained(str(models / "policy"))
    with torch.no_grad():
        other.model.norm.weight.add_(1.0)
    with pytest.raises(ValueError, match=r"ref_model differs from them at 'model.norm.weight'"):
        make(ref_model=other)
    with pytest.raises(ValueError, match="data_collator=None"):
        make(data_collator=lambda rows: rows)
    with pytest.raises(ValueError, match="no score head"):
        make(reward_model=policy)


def test_an_equal_reference_and_a_stop_token_id_are_taken(models, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models / "policy"))
    policy = AutoModelForCausalLM.from_pretrained(str(models / "policy"))
    twin = AutoModelForCausalLM.from_pretrained(str(models / "policy"))  # ppo.py's ref_policy
    reward = AutoModelForSequenceClassification.from_pretrained(str(models / "reward"), num_labels=1)
    rows = Dataset.from_list([{"input_ids": tok(w)["input_ids"]} for w in WORDS])
    stop = tok.convert_tokens_to_ids("?")
    trainer = PPOTrainer(_args(tmp_path, stop_token_id=stop, total_episodes=4), tok, policy, twin, reward, rows,
                         AutoModelForSequenceClassification.from_pretrained(str(models / "reward"), num_labels=1))
    assert stop in trainer._loop.sampling.eos_token_ids and tok.eos_token_id in trainer._loop.sampling.eos_token_ids


def test_ppo_config_keys_map_onto_slimgrpo_keys():
    values = convert({"num_ppo_epochs": 3, "num_mini_batches": 2, "cliprange": 0.1, "kl_coef": 0.02,
                      "vf_coef": 0.5, "cliprange_value": 0.3, "gamma": 0.99, "lam": 0.9, "whiten_rewards": True,
                      "response_length": 40, "temperature": 0.7, "local_rollout_forward_batch_size": 16,
                      "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "total_episodes": 20,
                      "max_steps": 100, "output_dir": "x"}).values
    assert {k: values[k] for k in ("loss.num_iterations", "loss.steps_per_generation", "loss.epsilon",
                                   "loss.kl_coef", "critic.vf_coef", "critic.cliprange_value", "loss.gamma",
                                   "loss.lam", "loss.whiten_rewards", "rollout.max_completion_length",
                                   "rollout.temperature", "rollout.max_batch_rows", "run.batch_size",
                                   "run.max_steps")} == {
        "loss.num_iterations": 3, "loss.steps_per_generation": 2, "loss.epsilon": 0.1, "loss.kl_coef": 0.02,
        "critic.vf_coef": 0.5, "critic.cliprange_value": 0.3, "loss.gamma": 0.99, "loss.lam": 0.9,
        "loss.whiten_rewards": True, "rollout.max_completion_length": 40, "rollout.temperature": 0.7,
        "rollout.max_batch_rows": 16, "run.batch_size": 8,
        "run.max_steps": 3}  # ceil(20 episodes / 8 completions a rollout): total_episodes wins over max_steps


def test_every_ppo_and_grpo_field_has_a_rule():
    """fields.json holds every field of TRL's classes (TRL 1.16's, and TRL 1.12's PPOConfig): each has a rule,
    PPOConfig's own ones from ``source="PPOConfig"``; no trl needed."""
    from importlib import resources

    fields = json.loads(resources.files("slimgrpo.trl").joinpath("fields.json").read_text())
    for part in ("grpo", "ppo"):
        for cls, spec in fields[part].items():
            if cls == "trl":  # the TRL version the part was read from
                continue
            missing = sorted(set(spec) - set(BY_KEY))
            assert not missing, f"{cls} fields without a rule: {missing}"
    own = set(fields["ppo"]["PPOConfig"]) - set(fields["grpo"]["GRPOConfig"])
    assert own and all(BY_KEY[k].source == "PPOConfig" for k in own)


def test_ppo_metrics_name_slimgrpos_figures_as_trl():
    from slimgrpo.trl.ppo import ppo_metrics

    got = ppo_metrics({"reward": 1.5, "ppo/kl_penalty": 0.01, "completions/mean_length": 10.0, "loss": 0.3,
                       "value/loss": 0.2, "value/clipfrac": 0.1, "entropy": 2.0, "learning_rate": 1e-5,
                       "clip_ratio/low_mean": 0.05, "clip_ratio/high_mean": 0.02}, kl_coef=0.05)
    # TRL's objective/kl sums the k1 KL over a completion: the per-token mean (0.01 / 0.05) x 10 tokens
    assert got["objective/kl"] == pytest.approx(2.0) and got["objective/non_score_reward"] == pytest.approx(-0.1)
    assert got["objective/rlhf_reward"] == pytest.approx(1.4) and got["objective/scores"] == 1.5
    assert got["policy/clipfrac_avg"] == pytest.approx(0.07)
    assert {got[k] for k in ("loss/policy_avg", "loss/value_avg", "val/clipfrac_avg", "policy/entropy_avg",
                             "lr")} == {0.3, 0.2, 0.1, 2.0, 1e-5}


def test_trls_model_helpers(models):
    from transformers import HfArgumentParser

    from slimgrpo.trl import ModelConfig, get_kbit_device_map, get_peft_config, get_quantization_config

    (args,) = HfArgumentParser(ModelConfig).parse_args_into_dataclasses(
        ["--use_peft", "--lora_r", "8", "--lora_target_modules", "q_proj", "v_proj"])
    peft = get_peft_config(args)
    assert (peft.r, sorted(peft.target_modules), peft.bias) == (8, ["q_proj", "v_proj"], "none")
    (plain,) = HfArgumentParser(ModelConfig).parse_args_into_dataclasses([])
    assert get_peft_config(plain) is None and get_quantization_config(plain) is None
    plain.load_in_4bit = True
    assert get_quantization_config(plain).load_in_4bit
    assert get_kbit_device_map() == (None if not torch.cuda.is_available() else {"": 0})


# ------------------------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_the_script_file_runs_in_its_own_process(models, tmp_path):
    """ppo.py's shape as a file, run as a script (``python ppo.py --use_peft ...``) in a fresh process."""
    (tmp_path / "ppo.py").write_text(SCRIPT)
    argv = _argv(models, tmp_path / "out", "--use_peft", "--lora_r", "8")
    proc = subprocess.run([sys.executable, str(tmp_path / "ppo.py"), *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model response" in proc.stdout  # generate_completions' table
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "value/loss" in r] == [1, 2]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
