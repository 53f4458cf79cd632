"""The learning suite's task recipes (examples/smollm2_*.py / .yaml): their rewards against hand-written
cases, their train / held-out splits fixed and disjoint, their recipes valid and alike. No model."""

import json

import pytest

from slimgrpo.config import load_config
from conftest import EXAMPLES, load_example_module

TASKS = ["word_problems", "extract", "sort"]


def msg(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("task", TASKS)
def test_recipe_copies_the_addition_settings(task):
    cfg = load_config(EXAMPLES / f"smollm2_{task}.yaml", ["model.path=some/model"])
    ref = load_config(EXAMPLES / "smollm2_addition.yaml", ["model.path=some/model"])
    for section, keys in {"rollout": ["num_generations", "max_completion_length", "temperature"],
                          "loss": ["loss_type", "beta"], "optim": ["learning_rate", "lr_scheduler_type"],
                          "run": ["max_steps", "batch_size"], "model": ["dtype"], "rewards": ["reward_weights"],
                          "memory": ["gradient_checkpointing"], "data": ["shuffle"]}.items():
        for key in keys:
            assert getattr(getattr(cfg, section), key) == getattr(getattr(ref, section), key), f"{section}.{key}"
    assert cfg.data.path.endswith(f"examples/data/{task}/train.jsonl")
    assert all(f.startswith(str(EXAMPLES / f"smollm2_{task}.py:")) for f in cfg.rewards.functions)
    assert cfg.model.path == ref.model.path
    assert cfg.run.output_dir == str(EXAMPLES.parent / "outputs" / f"smollm2-{task.replace('_', '-')}")


def test_word_problem_rewards():
    mod = load_example_module("smollm2_word_problems")
    completions = ["5", "5.", "Tom has 5 apples.", "3 + 4 - 2 = 5", "3 + 4 = 7", "", msg("He has 5"), "6"]
    assert mod.last_number_correct([""] * 8, completions, answer=["5"] * 8) == [1, 1, 1, 1, 0, 0, 1, 0]
    brevity = mod.only_the_number([""] * 8, completions)
    assert brevity[:2] == [1.0, 1.0] and brevity[2] == pytest.approx(1 - 4 / 20) and brevity[5] == 0.0


def test_extract_rewards():
    mod = load_example_module("smollm2_extract")
    completions = ["Lisbon", "Lisbon.", "It was shipped to Lisbon.", "Oslo", "From Oslo to Lisbon", "lisbon",
                   "Lisbonne", "", msg("Lisbon")]
    n = len(completions)
    score = mod.city_correct([""] * n, completions, answer=["Lisbon"] * n, other=["Oslo"] * n)
    # the destination named and the other city not; a whole word, any case
    assert score == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    brevity = mod.only_the_city([""] * n, completions)
    assert brevity[:2] == [1.0, 1.0] and brevity[3] == 1.0 and brevity[8] == 1.0
    assert brevity[2] == pytest.approx(1 - 5 / 20) and brevity[7] == 0.0
    assert brevity[5] == pytest.approx(1 - 1 / 20)  # not capitalised: not the bare city the prompt asks for


def test_sort_rewards():
    mod = load_example_module("smollm2_sort")
    completions = ["3, 9, 17", "3,9,17", "3, 9, 17.", "Sorted: 3, 9, 17", "17, 3, 9 sorted is 3, 9, 17", "3, 17, 9",
                   "9, 17", "", msg("3, 9, 17"), "1, 3, 9, 17"]
    n = len(completions)
    score = mod.sorted_correct([""] * n, completions, answer=["3, 9, 17"] * n)
    assert score == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    # the last n integers decide: an extra number before the list does not (accuracy), the format reward does not care
    brevity = mod.only_the_list([""] * n, completions)
    assert brevity[:3] == [1.0, 1.0, 1.0] and brevity[8] == 1.0
    assert brevity[3] == pytest.approx(1 - 4 / 20) and brevity[7] == 0.0
    assert mod.only_the_list([""], ["17"]) == [pytest.approx(1 - 1 / 20)]  # one number is not a list
    assert mod.sorted_correct([""], ["8, 14, 17, 25"], answer=["8, 14, 17, 25"]) == [1.0]


def _question(row):
    return row["prompt"][0]["content"]


@pytest.mark.parametrize("task", TASKS)
def test_split_is_fixed_and_disjoint(task, tmp_path):
    mod = load_example_module(f"smollm2_{task}")
    train, heldout = mod.make_rows()
    assert (len(train), len(heldout)) == (300, 100)
    assert mod.make_rows() == (train, heldout)  # the same rows on every call
    assert not {_question(r) for r in train} & {_question(r) for r in heldout}
    assert len({_question(r) for r in heldout}) == 100
    assert mod.main(["--make-data", str(tmp_path)]) == 0
    assert [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()] == heldout
    (tmp_path / "train.jsonl").write_text("mine\n")
    assert mod.main(["--make-data", str(tmp_path)]) == 0
    assert (tmp_path / "train.jsonl").read_text() == "mine\n"  # a user's file is never overwritten


def test_task_answers_are_right():
    import re

    words = load_example_module("smollm2_word_problems")
    for row in sum(words.make_rows(), []):
        start, gain, loss = (int(x) for x in re.findall(r"\d+", _question(row)))
        assert int(row["answer"]) == start + gain - loss > 0
    sort = load_example_module("smollm2_sort")
    for row in sum(sort.make_rows(), []):
        numbers = [int(x) for x in re.findall(r"\d+", _question(row))]
        assert row["answer"] == ", ".join(map(str, sorted(numbers))) and len(set(numbers)) == len(numbers) in (3, 4)
    extract = load_example_module("smollm2_extract")
    train, heldout = extract.make_rows()
    for row in train + heldout:
        assert f"shipped to {row['answer']} on" in _question(row) and f"packed in {row['other']} and" in _question(row)
    # no (packed, shipped) pair of a held-out text occurs in training
    assert not {(r["other"], r["answer"]) for r in train} & {(r["other"], r["answer"]) for r in heldout}


@pytest.mark.parametrize("recipe", [*(EXAMPLES / f"smollm2_{t}.yaml" for t in ("addition", *TASKS)),
                                    EXAMPLES.parent / "benchmarks" / "learning" / "tasks" / "smollm2_multiply.yaml"],
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("keep_best", [True, False])
def test_the_suite_runs_each_recipe_with_and_without_keep_best(recipe, keep_best, tmp_path):
    """learn_suite's overrides give a valid config either way (without keep_best the recipe's judge goes too:
    run.best_metric without an evaluation is refused). The recipes judge by the mean reward."""

    from benchmarks.learning import runs

    train = tmp_path / "train.jsonl"
    train.write_text("".join(f'{{"prompt": "q{i}", "answer": "{i}"}}\n' for i in range(40)))
    cfg = load_config(recipe, ["model.path=some/model", f"data.path={train}",
                               *runs.keep_best_overrides(train, keep_best)])
    assert cfg.run.keep_best is keep_best
    assert cfg.run.best_metric == ("eval/mean_reward" if keep_best else "")
