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


def _trl_script(*args: str, cwd: Path, timeout: float = 300):
    """examples/trl_gsm8k.py in a fresh process, as a user runs it (CUDA hidden)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run([sys.executable, str(EXAMPLES / "trl_gsm8k.py"), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def test_the_trl_gsm8k_script_is_trls_with_the_import_changed():
    """The worked example of docs/trl-migration.md: one import names slimgrpo, nothing else does, and trl is
    not imported (it runs where TRL is not installed)."""
    text = (EXAMPLES / "trl_gsm8k.py").read_text()
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    assert [line for line in imports if "slimgrpo" in line] == [
        "from slimgrpo.trl import GRPOConfig, GRPOTrainer  # was: from trl import GRPOConfig, GRPOTrainer"]
    assert not [line for line in imports if line.split()[1].split(".")[0] == "trl"]


def test_the_trl_gsm8k_script_trains_the_tiny_model(tmp_path, tiny_chat_model_dir):
    import json

    done = _trl_script("--model", str(tiny_chat_model_dir), "--max-steps", "2", "--max-completion-length", "8",
                       "--output-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert {f"rewards/{n}/mean" for n in ("tag_count_reward", "format_reward", "integer_reward",
                                           "correctness_reward")} <= set(rows[0])
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "model.safetensors").is_file()  # trainer.save_model(output_dir)
    assert done.stdout.strip().splitlines()[-1].startswith("step 2: reward ")


def test_the_trl_gsm8k_rewards_against_a_naive_reading():
    mod = load_example_module("trl_gsm8k")
    good = "<reasoning>\n6 * 3 = 18\n</reasoning>\n<answer>\n18\n</answer>\n"
    texts = [good, good.replace("18\n</answer>", "17\n</answer>"), "18", "<answer>18</answer> <answer>x</answer>",
             "<reasoning>r</reasoning><answer>1,8</answer>"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    answer = ["18"] * len(texts)
    assert mod.correctness_reward([None] * 5, completions, answer) == [2.0, 0.0, 0.0, 0.0, 0.0]
    assert mod.integer_reward(completions) == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert mod.format_reward(completions) == [0.5, 0.5, 0.0, 0.0, 0.5]
    assert mod.tag_count_reward(completions) == [0.5, 0.5, 0.0, 0.0, 0.5]
    rows = mod.gsm8k("test")
    assert rows[0]["answer"] == "18" and rows[0]["prompt"][0]["role"] == "system"
