"""A context past the model's position limit, after its rope scaling, is refused before any weight loads,
naming the limit, by ``slimgrpo train`` and ``slimgrpo plan``."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from slimgrpo.config.context import position_limit
from slimgrpo.runspec.shape import ModelShape

QWEN3_8B_YARN = {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960,
                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}


def test_position_limit_reads_rope_scaling():
    assert position_limit(QWEN3_8B_YARN) == (131072, "yarn rope scaling x4 over 32,768 positions")
    # Llama-3.1: llama3 scaling is already in max_position_embeddings (8 x 8,192 would say 65,536)
    llama = {"max_position_embeddings": 131072,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    assert position_limit(llama) == (131072, "max_position_embeddings 131,072")
    # transformers 5: rope_parameters, possibly per layer type; no original -> max_position_embeddings
    per_layer_type = {"full_attention": {"rope_type": "linear", "factor": 2.0},
                      "sliding_attention": {"rope_type": "default"}}
    assert position_limit({"max_position_embeddings": 1000, "rope_parameters": per_layer_type})[0] == 2000
    dynamic = {"type": "dynamic", "factor": 2}
    assert position_limit({"max_position_embeddings": 4096, "rope_scaling": dynamic})[0] == 8192
    assert position_limit({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default",
                                                                               "rope_theta": 1e6}})[0] == 4096
    assert position_limit({"max_position_embeddings": 4096, "rope_scaling": None})[0] == 4096
    assert position_limit({"text_config": {"max_position_embeddings": 512}})[0] == 512
    assert position_limit({"hidden_size": 8}) == (None, "")


def test_the_shape_takes_the_rope_scaled_window():
    assert ModelShape.from_hf_config(QWEN3_8B_YARN).max_positions == 131072
    assert ModelShape.from_hf_config({**QWEN3_8B_YARN, "rope_scaling": None}).max_positions == 40960


@pytest.fixture
def yarn_model(tmp_path, tiny_model_dir):
    """The tiny model with 64 positions and YaRN x3 over 48: a limit of 144."""
    folder = tmp_path / "yarn"
    shutil.copytree(tiny_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(max_position_embeddings=64,
               rope_scaling={"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 48})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _config(tmp_path, model_dir, completion):
    path = tmp_path / "c.yaml"
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    path.write_text(yaml.safe_dump({
        "model": {"path": str(model_dir), "dtype": "float32"}, "data": {"path": "p.jsonl", "max_prompt_length": 16},
        "rewards": {"functions": ["length"]}, "rollout": {"num_generations": 2, "max_completion_length": completion},
        "run": {"batch_size": 2, "device": "cpu", "max_steps": 1, "output_dir": str(tmp_path / "run")}}))
    return path


def test_plan_refuses_a_context_past_the_rope_scaled_limit(tmp_path, yarn_model, capsys):
    from slimgrpo.commands.cli import main

    assert main(["plan", str(_config(tmp_path, yarn_model, 100))]) == 0  # 116 > 64 but within YaRN's 144
    capsys.readouterr()
    code = main(["plan", str(_config(tmp_path, yarn_model, 129))])  # 16 + 129 = 145
    out = capsys.readouterr()
    text = out.out + out.err
    assert code != 0 and "fits" not in out.out
    assert "145 tokens exceeds" in text and "144 positions" in text and "rope scaling" in text
    assert "at most 128" in text


def test_plan_refuses_past_a_preset_window(capsys):
    from slimgrpo.commands.cli import main

    code = main(["plan", "--model", "qwen2.5-0.5b", "data.max_prompt_length=256",
                 "rollout.max_completion_length=32600"])
    out = capsys.readouterr()
    assert code != 0 and "32856 tokens exceeds" in out.out + out.err and "32768 positions" in out.out + out.err


def test_train_refuses_before_loading_weights(tmp_path, yarn_model, capsys):
    """The folder has no weights at all: the refusal comes first, naming the limit."""
    from run_helpers import train

    for weights in yarn_model.glob("*.safetensors"):
        weights.unlink()
    code = train(_config(tmp_path, yarn_model, 129))
    out = capsys.readouterr()
    text = out.out + out.err
    assert code != 0 and "144 positions" in text and "rope scaling" in text
    assert "no weights" not in text
