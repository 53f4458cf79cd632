"""The shipped recipes stay valid, and the example reward does what it says."""

from pathlib import Path

import pytest

from conftest import EXAMPLES, load_example_module
from slimgrpo.config import load_config


@pytest.mark.parametrize("name", ["gsm8k.yaml", "countdown.yaml", "smollm2_addition.yaml"])
def test_recipes_validate(name):
    cfg = load_config(EXAMPLES / name, ["model.path=some/model"])
    assert cfg.rollout.num_generations == 8


def test_gsm8k_recipe_runs_from_a_fresh_clone():
    """Its data is the sample shipped under examples/gsm8k/ (with its licence), not a developer's folder, and
    its run lands in outputs/ at the repository's root, where the docs look for it."""
    cfg = load_config(EXAMPLES / "gsm8k.yaml")
    data = Path(cfg.data.path)
    assert data.is_file() and data.parent == EXAMPLES / "gsm8k"
    assert (EXAMPLES / "gsm8k" / "LICENSE").read_text().startswith("MIT License")
    assert sum(1 for _ in data.open()) == 200 and data.stat().st_size < 200_000
    assert Path(cfg.run.output_dir) == EXAMPLES.parent / "outputs" / "gsm8k"
    addition = load_config(EXAMPLES / "smollm2_addition.yaml", validate=False)
    assert Path(addition.run.output_dir) == EXAMPLES.parent / "outputs" / "smollm2-addition"
    assert Path(addition.model.path) == EXAMPLES.parent / "models" / "smollm2"


def test_countdown_reward(tmp_path):
    mod = load_example_module()
    completions = ["<answer>(3 + 4) * 2</answer>", "<answer>3 + 4 + 4</answer>", "no tags",
                   "<answer>__import__('os')</answer>", [{"role": "assistant", "content": "<answer>3*4+2</answer>"}]]
    numbers = [[3, 4, 2, 9]] * 5
    target = [14, 11, 14, 0, 14]
    assert mod.countdown_reward([""] * 5, completions, numbers=numbers, target=target) == [1.0, 0.0, 0.0, 0.0, 1.0]
    mod.make_data(str(tmp_path / "c.jsonl"), n=5)
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 5


def test_addition_rewards_against_a_naive_reading():
    mod = load_example_module("smollm2_addition")
    completions = ["19", "19.", "The answer is 19.", "7 + 12 = 19", "7 + 12 = 18", "", "1,019",
                   [{"role": "assistant", "content": "It is 19"}], "-3"]
    answers = ["19"] * 8 + ["-3"]
    accuracy = mod.last_number_correct([""] * 9, completions, answer=answers)
    assert accuracy == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    brevity = mod.only_the_number([""] * 9, completions)
    # a bare integer (a trailing period allowed) scores 1; otherwise 1 - words / 20, floored at 0
    assert brevity[:2] == [1.0, 1.0] and brevity[-1] == 1.0
    assert brevity[2] == pytest.approx(1 - 4 / 20) and brevity[3] == pytest.approx(1 - 5 / 20)
    assert brevity[5] == 0.0  # an empty answer follows no instruction
    assert mod.only_the_number([""], ["word " * 30]) == [0.0]


def test_addition_data_split_is_fixed_and_disjoint(tmp_path):
    import json

    mod = load_example_module("smollm2_addition")
    train, heldout = mod.make_rows()
    assert (len(train), len(heldout)) == (300, 100)
    questions = [r["prompt"][0]["content"] for r in train + heldout]
    assert len(set(questions)) == 400  # every (a, b) pair once: no held-out question is trained on
    for row in train + heldout:
        a, b = (int(x) for x in row["prompt"][0]["content"].split("?")[0].removeprefix("What is ").split(" + "))
        assert int(row["answer"]) == a + b
    assert mod.make_rows() == (train, heldout)
    assert mod.main(["--make-data", str(tmp_path)]) == 0
    assert [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()] == heldout
    (tmp_path / "train.jsonl").write_text("mine\n")
    assert mod.main(["--make-data", str(tmp_path)]) == 0
    assert (tmp_path / "train.jsonl").read_text() == "mine\n"  # a user's file is never overwritten
