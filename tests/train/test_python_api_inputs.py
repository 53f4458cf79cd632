"""From Python: reward callables in cfg.rewards.functions and in-memory datasets; the data options that
build conversational GSM8K prompts for TRL-style rewards."""

import json

import pytest
import yaml

from slimgrpo.config import DataConfig, dump_config, load_config
from slimgrpo.data import DataError, build_dataset, read_rows
from slimgrpo.modeling import load_tokenizer

from conftest import GSM8K_TEST, needs_gsm8k


def length_share(prompts, completions, **kwargs):  # importable: dumped as module:qualname
    return [len(c if isinstance(c, str) else c[0]["content"]) / 100 for c in completions]


def trl_accuracy(prompts, completions, answer, **kwargs):
    """A TRL-documentation style reward: conversational completions, gold in the answer column."""
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


def api_config(tmp_path, model_dir, *extra):
    return load_config(None, [f"model.path={model_dir}", "rollout.num_generations=4", "run.batch_size=8",
                              "rollout.max_completion_length=6", "data.max_prompt_length=48", "run.max_steps=2",
                              f"run.output_dir={tmp_path / 'run'}", "log.progress=false", "run.save_model=false",
                              "run.save_checkpoints=false", "log.log_completions_steps=1", *extra], validate=False)


def test_callables_and_an_in_memory_dataset_train_end_to_end(tmp_path, tiny_model_dir):
    from slimgrpo.train.trainer import Trainer

    cfg = api_config(tmp_path, tiny_model_dir)
    cfg.rewards.functions = [length_share, lambda prompts, completions, **kw: [0.5] * len(completions), "length"]
    rows = [{"prompt": f"What is {a} plus {a}?", "answer": str(2 * a)} for a in range(6)]
    summary = Trainer(cfg, train_dataset=rows).train()
    assert summary["steps"] == 2
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"rewards/length_share/mean", "rewards/<lambda>/mean", "rewards/length/mean"} <= set(record)
    dumped = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert dumped["rewards"]["functions"] == [f"{__name__}:length_share", "<callable <lambda>>", "length"]
    assert dumped["data"]["path"] == "<in-memory dataset: 6 rows>"


def test_datasets_objects_and_dump(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}])
    assert read_rows(ds) == [{"prompt": "a"}, {"prompt": "b"}]
    assert read_rows(datasets.DatasetDict({"train": ds}), "train")[1] == {"prompt": "b"}
    with pytest.raises(DataError, match="splits"):
        read_rows(datasets.DatasetDict({"train": ds}), "test")
    with pytest.raises(DataError, match="row 2"):
        read_rows([{"prompt": "a"}, "b"])
    cfg = load_config(None, ["model.path=m", "rewards.functions=[length]"], validate=False)
    cfg.data.path = ds
    dump_config(cfg, tmp_path / "c.yaml")
    assert "<in-memory dataset: 2 rows>" in (tmp_path / "c.yaml").read_text()


@needs_gsm8k
def test_gsm8k_conversational_with_extracted_answers(tiny_chat_model_dir):
    tok = load_tokenizer(str(tiny_chat_model_dir))
    rows = read_rows(str(GSM8K_TEST))[:3]
    cfg = DataConfig(prompt_column="question", conversational=True, system_prompt="Answer with a number.",
                     answer_from="gsm8k", max_prompt_length=1000)
    ds = build_dataset(rows, tok, cfg)
    assert ds.prompts[0] == [{"role": "system", "content": "Answer with a number."},
                             {"role": "user", "content": rows[0]["question"]}]
    assert ds.columns["answer"][0] == rows[0]["answer"].rsplit("####", 1)[1].strip()
    assert ds.columns["answer_solution"][0] == rows[0]["answer"]
    with pytest.raises(DataError, match="####"):
        build_dataset([{"question": "q", "answer": "no marker"}], tok, cfg)


@needs_gsm8k
def test_trl_style_reward_on_gsm8k_conversational(tmp_path, tiny_chat_model_dir):
    from slimgrpo.train.trainer import Trainer

    cfg = api_config(tmp_path, tiny_chat_model_dir, f"data.path={GSM8K_TEST}", "data.prompt_column=question",
                     "data.conversational=true", "data.answer_from=gsm8k", "data.max_samples=8",
                     "data.max_prompt_length=400")
    cfg.rewards.functions = [trl_accuracy, "gsm8k_accuracy"]
    assert Trainer(cfg).train()["steps"] == 2
    sample = json.loads((tmp_path / "run" / "completions.jsonl").read_text().splitlines()[0])
    assert isinstance(sample["completion"], list) and sample["completion"][0]["role"] == "assistant"


def test_plain_text_prompts_with_a_conversational_reward_get_the_hint(tmp_path, tiny_model_dir):
    from slimgrpo.rewards import RewardFunctionError
    from slimgrpo.train.trainer import Trainer

    cfg = api_config(tmp_path, tiny_model_dir)
    cfg.rewards.functions = [trl_accuracy]
    rows = [{"prompt": "What is 1 plus 1?", "answer": "2"}] * 4
    with pytest.raises(RewardFunctionError, match="data.conversational"):
        Trainer(cfg, train_dataset=rows).train()
