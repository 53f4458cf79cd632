"""TRL 1.16's reward contract: ``trainer_state``, ``log_metric`` and ``log_extra`` reach reward functions;
functions without them keep working; the logs land in metrics.jsonl and completions.jsonl."""

import json

import pytest

from slimgrpo.config import load_config
from slimgrpo.rewards import RewardFunctionError, RewardRunner
from slimgrpo.rewards.contract import accepted_kwargs, make_trainer_state, step_means


def test_accepted_kwargs():
    def explicit(prompts, completions, trainer_state, log_metric=None):
        pass

    def plain(prompts, completions, completion_ids=None):
        pass

    def kw(prompts, completions, **kwargs):
        pass

    assert accepted_kwargs(explicit) == ("trainer_state", "log_metric")
    assert accepted_kwargs(plain) == ()
    assert accepted_kwargs(kw) == ("trainer_state", "log_metric", "log_extra")


def _trl_style(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
    """As in TRL's docs: shaped by progress, logs a metric and a column."""
    scale = trainer_state.global_step / trainer_state.max_steps
    lengths = [len(c) for c in completions]
    log_metric("custom/mean_len", sum(lengths) / len(lengths))
    log_metric("custom/mean_len", 0.0)  # a second call in the same step: the step's value is the mean
    log_extra("len", lengths)
    return [scale * n for n in lengths]


def _plain(prompts, completions, completion_ids=None):  # no **kwargs, no contract arguments
    return [1.0] * len(completions)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_runner_passes_state_and_collects_logs(isolation):
    state = make_trainer_state(max_steps=10)
    state.global_step = 5
    runner = RewardRunner([("trl", _trl_style), ("plain", _plain)], isolation=isolation)
    out = runner.score(["p"] * 3, ["a", "bb", "cccc"], None, trainer_state=state)
    assert out.per_function[:, 0].tolist() == [0.5, 1.0, 2.0]
    assert out.per_function[:, 1].tolist() == [1.0, 1.0, 1.0]
    assert out.logged_metrics == {"custom/mean_len": (7 / 3, 2)}
    assert step_means(out.logged_metrics) == {"custom/mean_len": pytest.approx(7 / 6)}
    assert out.extra_columns == {"len": [1, 2, 4]}


def test_step_means_over_two_ranks_is_one_process_with_every_call():
    from fake_ranks import ThreadRanks

    logged = [{"a": (1.0, 1)}, {"a": (3.0, 2), "b": (2.0, 1)}]  # rank 1 logs a name rank 0 never did
    got = ThreadRanks(2).run(lambda ranks: step_means(logged[ranks.rank], ranks))
    assert got[0] == got[1] == step_means({"a": (4.0, 3), "b": (2.0, 1)}) == {"a": 4 / 3, "b": 2.0}


def test_dataset_column_cannot_shadow_contract():
    runner = RewardRunner([("plain", _plain)])
    with pytest.raises(ValueError, match="trainer_state"):
        runner.score(["p"], ["a"], None, {"trainer_state": ["x"]})


def test_plain_text_completion_indexing_gets_a_hint():
    def trl_conversational(prompts, completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    runner = RewardRunner([("conv", trl_conversational)])
    with pytest.raises(RewardFunctionError, match="prompts are plain text") as e:
        runner.score(["p"], ["some text"], None)
    assert "data.conversational" in str(e.value)
    # conversational completions: works, and no hint on other errors
    out = runner.score([[{"role": "user", "content": "p"}]], [[{"role": "assistant", "content": "abc"}]], None)
    assert out.per_function[0, 0] == 3.0


REWARDS = """
def progress(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
    log_metric("progress/global_step", trainer_state.global_step)
    log_metric("progress/epoch", trainer_state.epoch)
    log_extra("step_seen", [trainer_state.global_step] * len(completions))
    return [float(trainer_state.global_step == trainer_state.max_steps - 1)] * len(completions)

def strict(prompts, completions, completion_ids, answer):  # explicit arguments, no **kwargs
    return [float(len(c)) for c in completions]
"""


def test_end_to_end_metrics_and_completion_columns(tmp_path, tiny_model_dir):
    from run_helpers import write_run
    from slimgrpo.train.runner import run_training

    cfg_path = write_run(tmp_path, tiny_model_dir, reward_code=REWARDS,
                         rewards={"functions": ["my_rewards.py:progress", "my_rewards.py:strict"]},
                         run={"max_steps": 2, "batch_size": 8, "output_dir": str(tmp_path / "run"),
                              "save_checkpoints": False, "save_model": False})
    run_training(load_config(cfg_path))
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["progress/global_step"] for r in records] == [0.0, 1.0]  # TRL: optimizer steps done so far
    assert records[0]["progress/epoch"] == 0.0 and records[1]["progress/epoch"] == pytest.approx(2 / 5)
    assert [r["rewards/progress/mean"] for r in records] == [0.0, 1.0]
    samples = [json.loads(ln) for ln in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert samples and all("step_seen" in s for s in samples)
