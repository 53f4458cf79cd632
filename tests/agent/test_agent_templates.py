"""Multi-turn rollouts under the real Qwen2.5 (Hermes) and Llama 3.1 (JSON) chat templates, read from the
installed TRL's chat_templates folder: calls parse, tool messages are rendered as the template does, and
the sampler's log-probs equal the update's recomputation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agent_helpers import ScriptedSampler
from conftest import build_tiny_model, build_tokenizer
from slimgrpo.agent import rollout as agent_mod
from slimgrpo.agent.rollout import AgentRollout
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.agent.environments import Toolbox
from slimgrpo.rollout.sampling import SamplingParams
from _update_calls import batch_logprobs
from slimgrpo.update import make_update_batch
from slimgrpo.containers import PromptBatch

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


FAMILIES = {
    # template file, special tokens, end-of-turn token, how the model writes a call
    "qwen2_5": ("qwen2_5.jinja", ["<|im_start|>", "<|im_end|>"], "<|im_end|>",
                lambda a, b: '<tool_call>\n{"name": "add", "arguments": ' + json.dumps({"a": a, "b": b})
                + "}\n</tool_call>"),
    "llama3_1": ("llama3_1.jinja", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], "<|eot_id|>",
                 lambda a, b: json.dumps({"name": "add", "parameters": {"a": a, "b": b}})),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    file, specials, eot, call = FAMILIES[name]
    if not (TEMPLATES / file).exists():
        pytest.skip(f"{file} not shipped by this TRL")
    folder = tmp_path_factory.mktemp(name)
    tok = build_tokenizer(folder)
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.chat_template = (TEMPLATES / file).read_text()
    tok.save_pretrained(str(folder))
    build_tiny_model(folder, vocab_size=len(tok), max_positions=2048)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return name, model, tok, tok.convert_tokens_to_ids(eot), call


def test_real_templates_multi_turn(family, monkeypatch):
    name, model, tok, eot, call = family
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [eot]  # noqa: E731
    scripts = [[enc(call(2, 3)), enc("It is 5.")], [enc("5")],
               [enc(call(40, 2)), enc(call(1, 1)), enc("Done.")], [enc("I think 42.")]]
    monkeypatch.setattr(agent_mod, "sample_next", ScriptedSampler(scripts, tok.pad_token_id))
    agent = AgentRollout(TorchRolloutEngine(model), tok, Toolbox([add]))
    batch = PromptBatch(prompts=[[{"role": "user", "content": "What is 2 plus 3?"}]] * 2, prompt_ids=[[1]] * 2,
                        columns={})
    params = SamplingParams(max_new_tokens=400, eos_token_ids=(eot,), pad_token_id=tok.pad_token_id)
    rollout = agent.generate(batch, 2, params)
    conv = rollout.conversations
    assert [m["role"] for m in conv[0]] == ["assistant", "tool", "assistant"]
    assert conv[0][0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert [m["content"] for m in conv[2] if m["role"] == "tool"] == ["42", "2"]
    # The tool message block fed to the model is the template's own rendering.
    suffix = tok.decode(agent.tool_suffix_ids([{"role": "tool", "name": "add", "content": "5"}], (eot,)))
    if name == "qwen2_5":
        assert suffix == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    else:
        assert "ipython" in suffix and "5" in suffix and suffix.endswith("assistant<|end_header_id|>\n\n")
    update = make_update_batch(rollout, torch.zeros(rollout.rows), mask_truncated=False)
    recomputed = batch_logprobs(model, update, micro=2, temperature=1.0, token_chunk=5, vocab_chunk=None)
    m = update.loss_mask
    torch.testing.assert_close(recomputed[m], rollout.sampler_logprobs[m], atol=1e-5, rtol=0)
