"""The shipped recipes stay valid, and the example reward does what it says."""

import importlib.util
from pathlib import Path

import pytest

from slimgrpo.config import load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", ["gsm8k.yaml", "countdown.yaml"])
def test_recipes_validate(name):
    cfg = load_config(EXAMPLES / name, ["model.path=some/model"])
    assert cfg.rollout.num_generations == 8


def test_gsm8k_recipe_points_at_the_shared_data():
    from slimgrpo.config import resolve_path

    cfg = load_config(EXAMPLES / "gsm8k.yaml")
    assert Path(resolve_path(cfg, cfg.data.path)).is_file()


def load_example_module():
    spec = importlib.util.spec_from_file_location("custom_reward", EXAMPLES / "custom_reward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_countdown_reward(tmp_path):
    mod = load_example_module()
    completions = ["<answer>(3 + 4) * 2</answer>", "<answer>3 + 4 + 4</answer>", "no tags",
                   "<answer>__import__('os')</answer>", [{"role": "assistant", "content": "<answer>3*4+2</answer>"}]]
    numbers = [[3, 4, 2, 9]] * 5
    target = [14, 11, 14, 0, 14]
    assert mod.countdown_reward([""] * 5, completions, numbers=numbers, target=target) == [1.0, 0.0, 0.0, 0.0, 1.0]
    mod.make_data(str(tmp_path / "c.jsonl"), n=5)
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 5
