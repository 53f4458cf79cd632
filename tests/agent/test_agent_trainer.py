"""Tools and environments through the Trainer: TRL-style tool functions and environment classes run
unchanged, from the Python API and from config specs; whole conversations reach completions.jsonl."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agent_helpers import TOOL_TEMPLATE, ScriptedSampler
from conftest import build_tiny_model, build_tokenizer
from slimgrpo.config import ConfigError, load_config
from slimgrpo.agent import rollout as agent_mod
from slimgrpo.train.trainer import Trainer


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2 with room for tool schemas in the prompt (1024 positions)."""
    folder = tmp_path_factory.mktemp("tiny_agent_model")
    tok = build_tokenizer(folder)
    build_tiny_model(folder, vocab_size=len(tok), max_positions=1024)
    return folder


# In the style of TRL's documentation: a plain function, type hints, a Google-style docstring.
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


# TRL's environment contract: reset(**row) may return text for the prompt, public methods are tools,
# get_reward() scores the rollout from the environment's state.
class CounterEnv:
    def __init__(self):
        self.counter = 0
        self.target = 0

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = int(kwargs["answer"])
        return f" Reach {self.target}."

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The counter after the increment.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else 0.0


REWARD_FILE = """
def answer_reward(completions, **kwargs):
    return [float("15" in c[-1]["content"]) for c in completions]
"""


PROMPTS = [{"prompt": [{"role": "user", "content": "What is 3 times 5?"}], "answer": "15"},
           {"prompt": [{"role": "user", "content": "What is 2 times 4?"}], "answer": "8"}]


def _config(tmp_path, model_dir, **rollout):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    data = {
        "model": {"path": str(model_dir)},
        "data": {"path": "prompts.jsonl", "max_prompt_length": 600, "chat_template": TOOL_TEMPLATE,
                 "shuffle": False},
        "rollout": {"num_generations": 2, "max_completion_length": 300, **rollout},
        "rewards": {"functions": []},
        "optim": {"learning_rate": 1e-3},
        "run": {"max_steps": 1, "batch_size": 4, "output_dir": str(tmp_path / "run"), "seed": 0,
                "save_checkpoints": False, "save_model": False},
        "log": {"progress": False, "log_completions_steps": 1, "num_completions_to_log": 4},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _script(tok, texts_per_row):
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # noqa: E731
    return [[enc(t) for t in turns] for turns in texts_per_row]


def _call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def test_trl_style_tool_from_the_python_api(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "rew.py").write_text(REWARD_FILE)
    cfg = load_config(_config(tmp_path, tiny_model_dir),  # an override's path: from the working directory
                      [f"rewards.functions=[{tmp_path / 'rew.py'}:answer_reward]"])
    trainer = Trainer(cfg, tools=[multiply])
    tok = trainer.policy.tokenizer
    scripts = _script(tok, [[_call("multiply", a=3, b=5), " 15"], [" 12"],
                            [_call("multiply", a=2), " 8"], [_call("divide", a=8, b=2), " 4"]])
    monkeypatch.setattr(agent_mod, "sample_next", ScriptedSampler(scripts, tok.pad_token_id))
    result = trainer.step()
    conv = result.completions
    assert conv[0][1] == {"role": "tool", "name": "multiply", "content": "15"}
    assert "missing 1 required positional argument" in conv[2][1]["content"]  # TRL: {'error': str(e)}
    assert conv[3][1]["content"] == "{'error': 'Tool divide not found.'}"
    assert result.rewards.per_function[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    m = result.metrics
    assert m["tools/calls_per_completion"] == pytest.approx(3 / 4)
    assert m["tools/failed_calls"] == 2 and m["tools/faults/not_found"] == 1 and m["tools/faults/exception"] == 1
    assert m["completions/max_length"] == max(sum(len(t) for t in s) for s in scripts)  # model tokens only


ENV_FILE = '''
class CounterEnv:
    def __init__(self):
        self.counter = 0
        self.target = 0

    def reset(self, **kwargs):
        self.counter = 0
        self.target = int(kwargs["answer"])
        return None

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return 1.0 if self.counter == self.target else 0.0
'''


def test_environment_from_config_spec_rewards_under_its_class_name(tmp_path, tiny_model_dir, monkeypatch):
    (tmp_path / "envs.py").write_text(ENV_FILE)
    path = _config(tmp_path, tiny_model_dir, environment="envs.py:CounterEnv", max_tool_calling_iterations=3)
    cfg = load_config(path)
    trainer = Trainer(cfg)
    assert trainer.reward_runner.names == ["CounterEnv"]
    tok = trainer.policy.tokenizer
    scripts = _script(tok, [[_call("increment", step=10), _call("increment", step=5), " done"], [" no"],
                            [_call("increment", step=8), " ok"], [_call("increment", step="x"), " hm"]])
    monkeypatch.setattr(agent_mod, "sample_next", ScriptedSampler(scripts, tok.pad_token_id))
    trainer.step_idx = 0
    result = trainer.step()
    assert result.rewards.per_function[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert [m["content"] for m in result.completions[0] if m["role"] == "tool"] == ["10", "15"]
    assert "can only concatenate str" in result.completions[3][1]["content"] or "unsupported operand" in \
        result.completions[3][1]["content"]
    trainer.step_idx = 1
    trainer.writer.log(1, result.metrics)
    trainer.maybe_log_completions(result)
    trainer.writer.close()
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    first = logged[0]["samples"][0] if "samples" in logged[0] else logged[0]
    assert [m["role"] for m in first["completion"]] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_environment_mapping_picks_by_column_and_rejects_unknown_names(tmp_path, tiny_model_dir):
    (tmp_path / "envs.py").write_text(ENV_FILE)
    path = _config(tmp_path, tiny_model_dir, environment={"counter": "envs.py:CounterEnv"})
    cfg = load_config(path)
    trainer = Trainer(cfg)
    batch = trainer.next_batch()
    with pytest.raises(ValueError, match="environment=None is not among"):
        trainer.generate(batch)


def test_bad_tool_spec_names_the_key(tmp_path, tiny_model_dir):
    path = _config(tmp_path, tiny_model_dir, tools=["nope.py:f"])
    cfg = load_config(path, ["rewards.functions=[length]"])
    with pytest.raises(ConfigError, match=r"rollout.tools\[0\]"):
        Trainer(cfg)


def test_trl_rollout_func_contract(tmp_path, tiny_model_dir):
    """TRL's rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, env_mask, extra...}."""
    seen = {}

    def rollout_func(prompts, trainer):
        tok = trainer.policy.tokenizer
        seen["prompts"] = prompts
        G = trainer.cfg.rollout.num_generations
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "judge": []}
        for i, p in enumerate(prompts):
            ids = tok(p[0]["content"], add_special_tokens=False)["input_ids"]
            for g in range(G):
                comp = tok(" 15" if g == 0 else " 7", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                out["prompt_ids"].append(ids)
                out["completion_ids"].append(comp)
                out["logprobs"].append([-1.0] * len(comp))
                out["env_mask"].append([1] * (len(comp) - 1) + [0])
                out["judge"].append(float(g == 0))
        return out

    (tmp_path / "rew.py").write_text("def judged(completions, judge, **kw):\n    return judge\n")
    cfg = load_config(_config(tmp_path, tiny_model_dir), [f"rewards.functions=[{tmp_path / 'rew.py'}:judged]"])
    trainer = Trainer(cfg, rollout_func=rollout_func)
    result = trainer.step()
    assert len(seen["prompts"]) == 2  # one per prompt, no duplication
    assert result.rewards.per_function[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    r = result.rollout
    assert torch.equal(r.model_lengths, r.completion_lengths - 1)  # env_mask=0 token left out
    assert result.completions[0] == [{"role": "assistant", "content": " 15"}]  # conversational prompts
