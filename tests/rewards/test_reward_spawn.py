"""rewards.isolation=process after CUDA is initialised: the child is spawned, not forked (a forked copy of a
CUDA process is unsafe), and a reward loaded from a file still runs there with its logs coming back.
CUDA cannot start here, so ``torch.cuda.is_initialized`` is patched to say it has."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from slimgrpo.rewards import process_call
from slimgrpo.rewards.loading import load_reward_function
from slimgrpo.rewards.scoring import RewardRunner

REWARD_FILE = '''
def length_reward(prompts, completions, log_metric=None, **kwargs):
    log_metric("seen", len(completions))
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def started(monkeypatch):
    """Records the start method of every reward child."""
    methods = []
    real = multiprocessing.get_context

    def recording(method=None):
        methods.append(method)
        return real(method)

    monkeypatch.setattr(process_call.multiprocessing, "get_context", recording)
    return methods


def test_fork_while_cuda_is_untouched(started):
    assert not torch.cuda.is_initialized()
    runner = RewardRunner([("len", lambda prompts, completions, **kw: [1.0] * len(completions))],
                          isolation="process")
    out = runner.score(["p", "q"], ["a", "bb"], None)
    assert out.total.tolist() == [1.0, 1.0]  # a lambda is fine under fork, as before
    assert started == ["fork"]


def test_spawn_once_cuda_is_initialised_runs_a_file_reward_with_its_logs(tmp_path, monkeypatch, started):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    name, fn = load_reward_function("my_rewards.py:length_reward", base_dir=tmp_path)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    runner = RewardRunner([(name, fn)], isolation="process", timeout_s=120)
    out = runner.score(["p", "q"], ["abc", "de"], None)
    assert started == ["spawn"]
    assert out.total.tolist() == [3.0, 2.0]
    assert out.logged_metrics == {"seen": (2.0, 1)}


def test_spawn_refuses_a_lambda_with_the_reason(monkeypatch, started):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    runner = RewardRunner([("lam", lambda prompts, completions, **kw: [0.0] * len(completions))],
                          isolation="process", on_error="raise")
    with pytest.raises(Exception, match="top level of a module or file"):
        runner.score(["p"], ["a"], None)
    assert started == []  # refused before any child started
