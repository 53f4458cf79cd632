"""A sequence-classification model as a reward function, scored as TRL's GRPOTrainer scores it."""

import json

import pytest
import torch

from slimgrpo.rewards import load_reward_function
from slimgrpo.rewards.reward_model import RewardModel

from conftest import build_tokenizer


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    folder = tmp_path_factory.mktemp("tiny_rm")
    tok = build_tokenizer(folder, chat_template=True)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0, eos_token_id=1)
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(str(folder))
    return folder


def reference(folder, texts):
    """One text at a time, no padding: the score the model gives each text alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=1).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    out = []
    for text in texts:
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out.append(float(model(**ids).logits[0, 0]))
    return out


def test_plain_text_scores_match_one_at_a_time(rm_dir):
    prompts = ["What is 1 plus 2?", "Say hi", "The quick brown fox"]
    completions = [" 3", " hello there, friend", " jumps"]
    name, rm = load_reward_function(str(rm_dir), device="cpu")
    assert name == rm_dir.name  # TRL: the basename of the model's name/path
    expected = reference(rm_dir, [p + c for p, c in zip(prompts, completions)])
    torch.testing.assert_close(torch.tensor(rm(prompts, completions)), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    small = RewardModel(str(rm_dir), device="cpu", batch_rows=2)  # batches of 2 (ragged): same scores
    torch.testing.assert_close(torch.tensor(small(prompts, completions)), torch.tensor(expected), rtol=1e-4,
                               atol=1e-5)


def test_conversational_uses_the_chat_template(rm_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    prompts = [[{"role": "user", "content": "What is 1 plus 2?"}]] * 2
    completions = [[{"role": "assistant", "content": "3"}], [{"role": "assistant", "content": "four"}]]
    texts = [tok.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    rm = RewardModel(str(rm_dir), device="cpu")
    assert rm.texts(prompts, completions) == texts
    torch.testing.assert_close(torch.tensor(rm(prompts, completions)), torch.tensor(reference(rm_dir, texts)),
                               rtol=1e-4, atol=1e-5)


def test_model_object_and_missing_folder(rm_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), num_labels=1)
    name, rm = load_reward_function(model, device="cpu")
    assert name == rm_dir.name and len(rm(["a"], [" b"])) == 1
    with pytest.raises(FileNotFoundError):
        RewardModel(str(tmp_path), device="cpu")


def test_trains_with_a_reward_model_folder(tmp_path, tiny_model_dir, rm_dir):
    from run_helpers import write_run
    from slimgrpo.config import load_config
    from slimgrpo.train.runner import run_training

    cfg_path = write_run(tmp_path, tiny_model_dir, rewards={"functions": [str(rm_dir), "length"]},
                         run={"max_steps": 1, "save_checkpoints": False, "save_model": False})
    run_training(load_config(cfg_path))
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert f"rewards/{rm_dir.name}/mean" in record
