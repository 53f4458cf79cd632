import json
from math import comb

import pytest

from slimgrpo.commands.cli import main
from slimgrpo.evaluate import pass_at_k


@pytest.mark.parametrize("n, c, k", [(8, 0, 1), (8, 3, 1), (8, 3, 4), (8, 8, 8), (5, 2, 5), (10, 1, 3)])
def test_pass_at_k_matches_the_combinatorial_formula(n, c, k):
    expected = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 4)


def test_eval_cli_on_demo_model_with_compare(tmp_path, capsys):
    from slimgrpo.demo import EVAL_FILE, MODEL_DIR

    out = tmp_path / "eval.json"
    rc = main(["eval", f"data.max_prompt_length=16", "rollout.max_completion_length=8",
               "--model", str(MODEL_DIR), "--compare", str(MODEL_DIR), "--data", str(EVAL_FILE),
               "--rewards", "slimgrpo.demo.task:demo_accuracy", "--num-samples", "4", "--k", "1", "4",
               "--limit", "20", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())[str(MODEL_DIR)]
    assert 0 < res["accuracy"] < 1 and res["pass@4"] >= res["pass@1"] and res["num_prompts"] == 20
    assert "pass@4" in capsys.readouterr().out


def test_eval_cli_errors(capsys):
    assert main(["eval", "--model", "x"]) == 2
    assert "--data" in capsys.readouterr().err
