"""Tool calls of different rows of one turn run concurrently (``rollout.max_concurrent_tool_calls``):
results in row order whatever order the calls finish in, the per-call time limit and result cap kept, wall
time ~ rows / concurrency x a call, the setting validated; an agent rollout is the same with 1 or 8."""

from __future__ import annotations

import time

import pytest
import torch

from run_helpers import train, write_run
from slimgrpo.agent.tool_calls import ToolCall, ToolRunner


def sleeper(seconds: float, tag: str) -> str:
    """Sleep, then answer with the tag.

    Args:
        seconds: how long to sleep
        tag: what to answer with
    """
    time.sleep(seconds)
    return f"{tag} slept {seconds}"


TABLE = {"sleeper": sleeper}


def _turns(delays: list[float]) -> list[tuple[list[ToolCall], dict]]:
    return [([ToolCall("sleeper", {"seconds": d, "tag": f"row{i}"})], TABLE) for i, d in enumerate(delays)]


def test_results_come_back_in_row_order_whatever_finishes_first():
    delays = [0.25, 0.0, 0.15, 0.05, 0.2, 0.1]  # later rows finish first
    runner = ToolRunner(timeout_s=5, max_concurrent=6)
    results = runner.run_rows(_turns(delays))
    assert [r[0].content for r in results] == [f"row{i} slept {d}" for i, d in enumerate(delays)]
    assert results == ToolRunner(timeout_s=5, max_concurrent=1).run_rows(_turns(delays))  # same as in a row


def test_each_call_keeps_its_time_limit_and_result_cap():
    turns = _turns([0.0, 3.0, 0.0]) + [([ToolCall("sleeper", {"seconds": 0, "tag": "x" * 50})], TABLE)]
    runner = ToolRunner(timeout_s=0.4, max_output_chars=20, max_concurrent=4)
    start = time.monotonic()
    results = runner.run_rows(turns)
    assert time.monotonic() - start < 2.0  # the slow call is abandoned at its limit
    assert [r[0].fault for r in results] == [None, "timeout", None, "truncated"]
    assert "timed out after 0.4 s" in results[1][0].content
    assert results[3][0].content.startswith("x" * 20) and "truncated" in results[3][0].content


@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_wall_time_is_about_rows_over_concurrency_times_a_call(concurrency):
    n, call = 8, 0.2
    start = time.monotonic()
    ToolRunner(timeout_s=5, max_concurrent=concurrency).run_rows(_turns([call] * n))
    elapsed = time.monotonic() - start
    expected = -(-n // concurrency) * call  # ceil(n / concurrency) rounds of one call
    assert expected * 0.9 <= elapsed < expected + 0.6, (concurrency, elapsed)  # generous: a shared machine


def test_max_concurrent_below_one_is_refused(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(ValueError, match="max_concurrent"):
        ToolRunner(max_concurrent=0)
    cfg = write_run(tmp_path, tiny_model_dir)
    assert train(cfg, "rollout.max_concurrent_tool_calls=0") == 2
    assert "rollout.max_concurrent_tool_calls must be > 0, got 0" in capsys.readouterr().err


def test_agent_rollout_is_the_same_with_concurrent_tool_calls(tiny_model_dir, monkeypatch):
    """Rows whose tools answer after different delays: one row after another, or 8 at once, the rollout
    (tokens, tool mask, conversations, metrics) is the same."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_helpers import TOOL_TEMPLATE, ScriptedSampler
    from slimgrpo.agent import rollout as agent_mod
    from slimgrpo.agent.rollout import AgentRollout
    from slimgrpo.rollout.engine import TorchRolloutEngine
    from slimgrpo.agent.environments import Toolbox
    from slimgrpo.rollout.sampling import SamplingParams
    from slimgrpo.containers import PromptBatch

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = TOOL_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    eos = tok.eos_token_id

    def call(seconds, tag):
        text = '<tool_call>{"name": "sleeper", "arguments": {"seconds": %s, "tag": "%s"}}</tool_call>' % (seconds,
                                                                                                        tag)
        return tok(text, add_special_tokens=False)["input_ids"] + [eos]

    scripts = [[call(0.02 * (6 - i), f"r{i}"), tok(" ok", add_special_tokens=False)["input_ids"] + [eos]]
               for i in range(6)]
    params = SamplingParams(max_new_tokens=200, temperature=1.0, eos_token_ids=(eos,), pad_token_id=tok.pad_token_id)
    batch = PromptBatch(prompts=["a", "b"], prompt_ids=[[1], [1]], columns={})
    out = []
    for concurrency in (1, 8):
        agent = AgentRollout(TorchRolloutEngine(model), tok, Toolbox([sleeper]),
                             ToolRunner(timeout_s=5, max_concurrent=concurrency))
        monkeypatch.setattr(agent_mod, "sample_next", ScriptedSampler([list(s) for s in scripts], tok.pad_token_id))
        out.append(agent.generate(batch, 3, params))
    one, many = out
    assert torch.equal(one.completion_ids, many.completion_ids) and torch.equal(one.tool_mask, many.tool_mask)
    assert one.conversations == many.conversations and one.metrics == many.metrics
    assert [c[1]["content"] for c in many.conversations] == [f"r{i} slept {0.02 * (6 - i)}" for i in range(6)]
