"""The tool demo's assets: the call tokens spell the chat template's JSON, the call parses, the reward
reads the final answer; a short run of the demo pipeline (slow)."""

from __future__ import annotations

import json

import pytest

from slimgrpo.demo.tools_task import (CALL_CLOSE, CALL_MID, CALL_OPEN, add, final_answer, make_splits,
                                      tool_accuracy)
from slimgrpo.agent.tool_calls import parse_tool_calls


def test_splits_are_disjoint_on_hard_problems_and_reproducible():
    train, evals = make_splits()
    assert make_splits() == (train, evals)
    hard = lambda rows: {r["prompt"] for r in rows if len(r["prompt"]) > 6}  # noqa: E731
    assert not hard(train) & hard(evals)
    assert all(str(eval(r["prompt"].rstrip("="))) == r["answer"] for r in train[:50])


def test_call_spelling_matches_the_template_and_parses():
    from slimgrpo.commands.demo_tools import TOOLS_DIR
    from transformers import AutoTokenizer

    if not (TOOLS_DIR / "model" / "tokenizer.json").exists():
        pytest.skip("tool demo assets not built")
    tok = AutoTokenizer.from_pretrained(str(TOOLS_DIR / "model"))
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 4821, "b": 3967}}}
    messages = [{"role": "user", "content": "4821+3967="}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": "8788"}, {"role": "assistant", "content": "8788"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    written = CALL_OPEN + "4821" + CALL_MID + "3967" + CALL_CLOSE
    assert text == "4821+3967=" + written + "<eos><tool>8788<eos>8788<eos>"
    ids = tok(written, add_special_tokens=False)["input_ids"]
    assert len(ids) == 11 and tok.decode(ids, skip_special_tokens=False) == written
    [parsed] = parse_tool_calls(written)
    assert parsed.name == "add" and add(**parsed.arguments) == 8788


def test_reward_scores_the_last_answer():
    conv = [{"role": "assistant", "content": "", "tool_calls": [{}]}, {"role": "tool", "content": "12"},
            {"role": "assistant", "content": "12"}]
    assert tool_accuracy(None, [conv, conv[:1], [{"role": "assistant", "content": "13"}]], ["12"] * 3) == [1, 0, 0]
    assert final_answer("12<eos><pad>") == "12"


@pytest.mark.slow
def test_demo_runs_a_few_steps(tmp_path, capsys):
    from slimgrpo.commands.demo_tools import TOOLS_DIR, run_tool_demo

    if not (TOOLS_DIR / "model" / "model.safetensors").exists():
        pytest.skip("tool demo assets not built")
    assert run_tool_demo(str(tmp_path / "run"), ["run.max_steps=2", "log.log_completions_steps=1"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["eval_after"]["sampled"]["accuracy"] <= 1
    line = json.loads((tmp_path / "run" / "completions.jsonl").read_text().splitlines()[0])
    assert "completion" in json.dumps(line)
    out = capsys.readouterr().out  # the main demo's lines: greedy before sampled, and what to run next
    assert "eval before training: greedy" in out and out.index("greedy") < out.index("sampled")
    assert f"next: slimgrpo report {tmp_path / 'run'}" in out.replace("\n", "")
