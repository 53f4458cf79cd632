"""Multi-turn tool rollouts: KV continuation, the loss mask, the update's token sequence."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_helpers import TOOL_TEMPLATE, ScriptedSampler
from slimgrpo.agent import rollout as agent_mod
from slimgrpo.agent.rollout import AgentRollout, AgentSettings
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.agent.environments import Toolbox
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.agent.tool_calls import ToolRunner
from _update_calls import batch_logprobs
from slimgrpo.update import make_update_batch
from slimgrpo.containers import PromptBatch


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = TOOL_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    return model, tok


def _call_text(a, b):
    return "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + "</tool_call>"


def _scripts(tok, G):
    eos = tok.eos_token_id
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [eos]  # noqa: E731
    scripts = [
        [enc(_call_text(2, 3)), enc(" The answer is 5.")],  # one call, then an answer
        [enc(" 42")],  # no call
        [enc("let me " + _call_text(10, 200)), enc(_call_text(1, 1)), enc(" done")],  # two rounds
        [enc(_call_text(7, 8)), enc(" 15")],
    ]
    return (scripts * ((2 * G + 3) // 4))[: 2 * G]


def _run(model, tok, monkeypatch, G=3, max_new=200, max_iterations=None):
    engine = TorchRolloutEngine(model)
    agent = AgentRollout(engine, tok, Toolbox([add]), ToolRunner(timeout_s=5),
                         AgentSettings(max_iterations=max_iterations))
    scripts = _scripts(tok, G)
    if max_iterations is not None:  # the sampler must know which rows stop early
        scripts = [s[: max_iterations + 1] for s in scripts]
    monkeypatch.setattr(agent_mod, "sample_next", ScriptedSampler(scripts, tok.pad_token_id))
    batch = PromptBatch(prompts=["What is 2 plus 3?", [{"role": "user", "content": "Add 10 and 200"}]],
                        prompt_ids=[[1], [1]], columns={"answer": ["5", "210"]})
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, eos_token_ids=(tok.eos_token_id,),
                            pad_token_id=tok.pad_token_id)
    return agent, agent.generate(batch, G, params), scripts


def test_conversation_tokens_match_the_chat_template(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    agent, rollout, scripts = _run(model, tok, monkeypatch)
    conv = rollout.conversations
    assert [m["role"] for m in conv[0]] == ["assistant", "tool", "assistant"]
    assert conv[0][1]["content"] == "5" and conv[0][2]["content"] == " The answer is 5."
    assert conv[0][0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert [m["role"] for m in conv[1]] == ["assistant"]
    assert [m["content"] for m in conv[2] if m["role"] == "tool"] == ["210", "2"]
    # The whole sequence is what the chat template renders for the conversation: no drift between
    # what the sampler saw and what the conversation says.
    prompts = ["What is 2 plus 3?"] * 3 + ["Add 10 and 200"] * 3
    for r in range(rollout.rows):
        messages = [{"role": "user", "content": prompts[r]}] + conv[r]
        text = tok.apply_chat_template(messages, tools=[add], tokenize=False)
        k = int(rollout.completion_lengths[r])
        got = rollout.prompt_ids[r][rollout.prompt_mask[r]].tolist() + rollout.completion_ids[r, :k].tolist()
        # Text, not ids: BPE merges across the boundaries the sampler saw differ from a one-shot encode.
        assert text.rstrip("\n") == tok.decode(got)


def test_tool_tokens_are_masked_and_model_tokens_are_not(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    _, rollout, scripts = _run(model, tok, monkeypatch)
    for r in range(rollout.rows):
        model_written = sum(len(t) for t in scripts[r])
        assert int(rollout.model_lengths[r]) == model_written
        assert int(rollout.completion_lengths[r]) - model_written == int((rollout.completion_mask[r]
                                                                         & ~rollout.tool_mask[r]).sum())
        assert torch.all(rollout.sampler_logprobs[r][~rollout.tool_mask[r]] == 0)
    update = make_update_batch(rollout, torch.ones(rollout.rows), mask_truncated=False)
    assert torch.equal(update.loss_mask, rollout.completion_mask & rollout.tool_mask)
    assert rollout.metrics["tools/calls_per_completion"] == pytest.approx(
        sum(len(s) - 1 for s in scripts) / len(scripts))


def test_sampler_logprobs_equal_update_recomputation(model_and_tok, monkeypatch):
    """KV continuation (holes for waiting rows, tool tokens prefilled on the kept cache) gives the same
    log-probs as one full forward over the final sequence, which is what the update computes."""
    model, tok = model_and_tok
    _, rollout, _ = _run(model, tok, monkeypatch)
    update = make_update_batch(rollout, torch.zeros(rollout.rows), mask_truncated=False)
    recomputed = batch_logprobs(model, update, micro=None, temperature=1.0, token_chunk=7, vocab_chunk=None)
    m = update.loss_mask
    assert int(m.sum()) > 50
    torch.testing.assert_close(recomputed[m], rollout.sampler_logprobs[m], atol=1e-5, rtol=0)


def test_no_reprefill_of_the_conversation(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    widths = []
    decoder = TorchRolloutEngine(model).parts.decoder
    hook = decoder.register_forward_pre_hook(lambda mod, args, kwargs: widths.append(kwargs["input_ids"].shape),
                                             with_kwargs=True)
    try:
        agent, rollout, scripts = _run(model, tok, monkeypatch)
    finally:
        hook.remove()
    distinct_prompts = 2
    assert widths[0][0] == distinct_prompts  # one prefill per distinct prompt, fanned out to the G rows
    # Every later call feeds one decode token, or the tool-message tokens (+ the turn's last token):
    # never the conversation again.
    suffix = len(agent.tool_suffix_ids([{"role": "tool", "name": "add", "content": "210"}], (tok.eos_token_id,)))
    assert all(w[1] == 1 or w[1] <= suffix + 1 for w in widths[1:])
    assert sum(1 for w in widths[1:] if w[1] > 1) == 2  # two tool rounds


def test_length_limit_and_iteration_limit(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    _, rollout, scripts = _run(model, tok, monkeypatch, max_iterations=1)
    # Row 2 would call twice; with one iteration its second call is left unanswered and the row ends.
    assert [m["role"] for m in rollout.conversations[2]] == ["assistant", "tool", "assistant"]
    assert "tool_calls" in rollout.conversations[2][-1]
    assert int(rollout.completion_lengths.max()) <= 200


def test_max_batch_rows_chunks_give_the_same_greedy_rollout(model_and_tok):
    model, tok = model_and_tok
    batch = PromptBatch(prompts=["What is 2 plus 3?", "Add 10 and 200", "7 + 8"], prompt_ids=[[1]] * 3,
                        columns={})
    params = SamplingParams(max_new_tokens=12, temperature=0.0, eos_token_ids=(tok.eos_token_id,),
                            pad_token_id=tok.pad_token_id)
    outs = []
    for rows in (None, 4):
        agent = AgentRollout(TorchRolloutEngine(model, max_batch_rows=rows), tok, Toolbox([add]))
        outs.append(agent.generate(batch, 2, params))
    assert torch.equal(outs[0].completion_ids, outs[1].completion_ids)
    assert torch.equal(outs[0].completion_mask, outs[1].completion_mask)
