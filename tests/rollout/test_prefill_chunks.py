"""Chunked prefill: prompts are prefilled ``prefill_chunk`` positions at a time, so the
prefill's working set is one chunk's whatever the prompt length; the tokens and log-probs equal those of
the one-piece prefill (left-padded prompts of three lengths, chunk sizes that divide none of them), and
the plan counts one chunk."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.rollout.costs import PREFILL_CHUNK_TOKENS
from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape, load_shape
from slimgrpo.rollout import SamplingParams, TorchRolloutEngine
from slimgrpo.trace.synthetic import random_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [list(range(3, 26)), list(range(30, 37)), list(range(40, 55))]  # 23, 7 and 15 tokens


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("chunk", [1, 4, 9, 23])
def test_chunked_prefill_equals_one_piece(family, chunk):
    shape = ModelShape(family, hidden=64, intermediate=96, layers=3, heads=4, kv_heads=2, vocab=101, tie=False,
                       max_positions=256)
    torch.manual_seed(0)
    model = random_causal_lm(shape, torch.float32, "cpu", initializer_range=0.2).eval()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, eos_token_ids=(), pad_token_id=0)
    runs = [TorchRolloutEngine(model, prefill_chunk=c).generate(PROMPTS, 2, params, torch.Generator().manual_seed(5))
            for c in (None, chunk)]
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    torch.testing.assert_close(runs[0].sampler_logprobs, runs[1].sampler_logprobs, rtol=0, atol=1e-4)


def test_prefill_runs_one_chunk_at_a_time(monkeypatch):
    shape = ModelShape("llama", hidden=64, intermediate=96, layers=2, heads=4, kv_heads=2, vocab=101, tie=False)
    model = random_causal_lm(shape, torch.float32, "cpu").eval()
    engine = TorchRolloutEngine(model, prefill_chunk=10)
    widths = []
    forward = engine.parts.decoder.forward
    monkeypatch.setattr(engine.parts.decoder, "forward",
                        lambda input_ids=None, **kw: widths.append(input_ids.shape[1]) or forward(input_ids=input_ids, **kw))
    engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=1, eos_token_ids=(), pad_token_id=0))
    assert widths == [10, 10, 3]  # 23 positions: two whole chunks and the rest
    with pytest.raises(ValueError, match="prefill_chunk"):
        TorchRolloutEngine(model, prefill_chunk=0)


def test_plan_counts_one_prefill_chunk():
    shape = load_shape("llama-3.1-8b")
    short = plan_memory(shape, RunSpec(max_prompt_length=PREFILL_CHUNK_TOKENS, max_completion_length=256))
    long = plan_memory(shape, RunSpec(max_prompt_length=8 * PREFILL_CHUNK_TOKENS, max_completion_length=256))
    a, b = short.bytes_of("prefill working set"), long.bytes_of("prefill working set")
    # the layer's working set is one chunk's at any length; only the mask grows, with chunk x P
    assert b < 1.5 * a
