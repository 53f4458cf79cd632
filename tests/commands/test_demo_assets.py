"""The bundled demo assets exist, load, and agree with the task code that describes them."""

from __future__ import annotations

import json

import pytest

from slimgrpo.demo import (
    EVAL_FILE,
    MODEL_DIR,
    TRAIN_FILE,
    demo_accuracy,
    demo_config_dict,
    demo_well_formed,
    make_dataset,
)
from slimgrpo.demo.task import NUM_EVAL, NUM_TRAIN, make_splits

SAMPLE_TEXTS = ["37+48=", "37+48=85", "10+99=109", "5 5"]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- files


def test_asset_files_exist_and_weights_are_small():
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"]:
        path = MODEL_DIR / name
        assert path.is_file(), f"missing {path}; rebuild with scripts/build_demo_model.py"
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= 5 * 1024 * 1024
    assert TRAIN_FILE.is_file() and EVAL_FILE.is_file()


def test_tokenizer_config_pins_the_class():
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


# ----------------------------------------------------------------------------- tokenizer and model


@pytest.fixture(scope="module")
def tokenizers_both_ways():
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    return (PreTrainedTokenizerFast.from_pretrained(MODEL_DIR),
            AutoTokenizer.from_pretrained(MODEL_DIR))


def test_tokenizer_loads_the_same_both_ways(tokenizers_both_ways):
    fast, auto = tokenizers_both_ways
    assert type(auto) is type(fast)
    assert auto.get_vocab() == fast.get_vocab()
    for text in SAMPLE_TEXTS:
        assert auto(text)["input_ids"] == fast(text)["input_ids"]
    assert (auto.eos_token_id, auto.pad_token_id) == (fast.eos_token_id, fast.pad_token_id)


def test_tokenizer_is_character_level_and_round_trips(tokenizers_both_ways):
    tok, _ = tokenizers_both_ways
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    ids = tok("37+48=")["input_ids"]
    assert len(ids) == 6  # one token per character, nothing added around the prompt
    assert tok.decode(ids) == "37+48="
    completion = tok("85", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(completion, skip_special_tokens=True) == "85"
    assert tok.decode(completion) == "85<eos>"


def test_model_loads_and_matches_tokenizer(tokenizers_both_ways):
    import torch
    from transformers import AutoModelForCausalLM

    tok, _ = tokenizers_both_ways
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = torch.tensor([tok("37+48=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 6, len(tok))
    assert torch.isfinite(logits).all()


def test_model_works_with_hf_generate(tokenizers_both_ways):
    import torch
    from transformers import AutoModelForCausalLM

    tok, _ = tokenizers_both_ways
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    ids = torch.tensor([tok("37+48=")["input_ids"]])
    out = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    completion = tok.decode(out[0, 6:], skip_special_tokens=True)
    assert completion.isdigit() and 2 <= len(completion) <= 3  # the warm-start answers numbers


# ----------------------------------------------------------------------------- reward


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("85", "85", 1.0),
        ("85<eos>", "85", 1.0),  # decoded without skip_special_tokens
        ("85<eos><pad><pad>", "85", 1.0),
        ("85<eos>17", "85", 1.0),  # anything after EOS was never part of the answer
        (" 85\n", "85", 1.0),  # surrounding whitespace is ignored
        ("109", "109", 1.0),
        ("86", "85", 0.0),
        ("75", "85", 0.0),  # the forgotten carry
        ("850", "85", 0.0),
        ("85 1", "85", 0.0),  # trailing junk makes it wrong
        ("85+", "85", 0.0),
        ("8 5", "85", 0.0),
        ("085", "85", 0.0),
        ("", "85", 0.0),
        ("<eos>", "85", 0.0),
    ],
)
def test_demo_accuracy_cases(completion, answer, reward):
    assert demo_accuracy(["37+48="], [completion], answer=[answer]) == [reward]


def test_demo_accuracy_follows_trl_contract():
    rewards = demo_accuracy(
        prompts=["10+10=", "10+10="], completions=["20", "21"], answer=["20", "20"],
        completion_ids=[[1], [2]], trainer_state=None,
    )
    assert rewards == [1.0, 0.0]
    with pytest.raises(ValueError, match="repeated"):
        demo_accuracy(["10+10="], ["20", "20"], answer=["20"])


def test_demo_well_formed():
    assert demo_well_formed(None, ["85", "109<eos>", "", "8 5", "1234", "x"]) == [
        1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- data


def test_bundled_splits_are_disjoint_and_correct():
    train, held_out = read_jsonl(TRAIN_FILE), read_jsonl(EVAL_FILE)
    assert (len(train), len(held_out)) == (NUM_TRAIN, NUM_EVAL)
    train_prompts = {r["prompt"] for r in train}
    eval_prompts = {r["prompt"] for r in held_out}
    assert len(train_prompts) == len(train) and len(eval_prompts) == len(held_out)
    assert not train_prompts & eval_prompts
    for row in train + held_out:
        a, b = row["prompt"].rstrip("=").split("+")
        assert row["answer"] == str(int(a) + int(b))


def test_bundled_splits_match_the_task_code():
    train, held_out = make_splits()
    assert read_jsonl(TRAIN_FILE) == train
    assert read_jsonl(EVAL_FILE) == held_out


def test_make_dataset_is_deterministic():
    assert make_dataset(50, seed=3) == make_dataset(50, seed=3)
    assert make_dataset(50, seed=3) != make_dataset(50, seed=4)
    rows = make_dataset(50, seed=3)
    assert set(rows[0]) == {"prompt", "answer"}
    assert len({r["prompt"] for r in rows}) == 50


def test_make_dataset_exclude_and_bounds():
    excluded = {r["prompt"] for r in make_dataset(8000, seed=0)}
    rest = make_dataset(100, seed=0, exclude=excluded)
    assert len(rest) == 100 and not {r["prompt"] for r in rest} & excluded
    with pytest.raises(ValueError, match="out of range"):
        make_dataset(101, seed=0, exclude=excluded)


def test_demo_config_dict_has_the_agreed_keys():
    config = demo_config_dict()
    assert {"learning_rate", "num_generations", "prompts_per_step", "max_steps",
            "max_completion_length", "temperature", "beta"} <= set(config)
    assert config["num_generations"] >= 2
    assert config["max_completion_length"] >= 4  # three digits and EOS


# ----------------------------------------------------------------------------- the vLLM twin (model_h32)


def test_the_vllm_twin_is_the_demo_model_with_heads_of_32():
    """model_h32 has the demo model's tokenizer (byte for byte), shapes and parameter count; only the split of
    hidden size 64 into attention heads differs (2 of 32 instead of 4 of 16), a size vLLM's CPU attention takes."""
    from slimgrpo.config.sections.rollout import VLLM_CPU_HEAD_SIZES, _head_size
    from slimgrpo.demo import VLLM_MODEL_DIR
    from safetensors import safe_open

    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        assert (VLLM_MODEL_DIR / name).read_bytes() == (MODEL_DIR / name).read_bytes(), name
    assert _head_size(MODEL_DIR) == 16 and _head_size(VLLM_MODEL_DIR) == 32 in VLLM_CPU_HEAD_SIZES

    def settings(d, name):  # the transformers version that wrote a file is not a setting
        return {k: v for k, v in json.loads((d / name).read_text()).items() if k != "transformers_version"}

    main, twin = settings(MODEL_DIR, "config.json"), settings(VLLM_MODEL_DIR, "config.json")
    differ = {k for k in main.keys() | twin.keys() if main.get(k) != twin.get(k)}
    assert differ == {"num_attention_heads", "num_key_value_heads", "head_dim"}, differ
    assert settings(MODEL_DIR, "generation_config.json") == settings(VLLM_MODEL_DIR, "generation_config.json")

    def shapes(d):
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}

    assert shapes(MODEL_DIR) == shapes(VLLM_MODEL_DIR)


def test_demo_on_vllm_trains_the_twin(monkeypatch, tmp_path):
    """``slimgrpo demo rollout.engine=vllm`` validates with model_h32 (vLLM treated as installed here); the
    bundled model itself is refused for its head size, and a user's own model.path is left alone."""
    from slimgrpo.commands import demo as demo_cmd
    from slimgrpo.config import ConfigError
    from slimgrpo.config.sections import rollout as rollout_section
    from slimgrpo.demo import VLLM_MODEL_DIR

    monkeypatch.setattr(rollout_section, "vllm_installed", lambda: True)
    monkeypatch.setattr(rollout_section, "_torchvision_clash", lambda: None)
    cfg, _ = demo_cmd.demo_config(str(tmp_path / "d"), ["rollout.engine=vllm"])
    assert str(cfg.model.path) == str(VLLM_MODEL_DIR)
    cfg, _ = demo_cmd.demo_config(str(tmp_path / "d"), [])
    assert str(cfg.model.path) == str(MODEL_DIR)  # the default engine keeps the demo model
    import shutil

    mine = shutil.copytree(VLLM_MODEL_DIR, tmp_path / "mine")
    cfg, _ = demo_cmd.demo_config(str(tmp_path / "d"), ["rollout.engine=vllm", f"model.path={mine}"])
    assert str(cfg.model.path) == str(mine)
    monkeypatch.setattr(demo_cmd, "twin_for_vllm", lambda cfg: False)
    with pytest.raises(ConfigError, match="head size is 16"):
        demo_cmd.demo_config(str(tmp_path / "d"), ["rollout.engine=vllm"])
