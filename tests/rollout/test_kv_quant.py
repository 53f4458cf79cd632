"""Quantised KV cache (rollout.kv_cache_dtype) on the bundled demo model: greedy tokens against the
full-precision cache, and the per-token log-prob drift (printed; run with -s to see it)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import slimgrpo
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.rollout.kv_quant import dequantize, quantize
from slimgrpo.rollout.sampling import SamplingParams

DEMO = Path(slimgrpo.__file__).parent / "demo" / "model"


@pytest.mark.parametrize("kind", ["int8", "fp8_e4m3"])
def test_quantize_round_trip_error_is_small(kind):
    x = torch.randn(3, 4, 7, 16) * torch.logspace(-2, 2, 16)
    codes, scale = quantize(x, kind)
    assert codes.element_size() == 1 and scale.shape == (3, 4, 7, 1)
    err = (dequantize(codes, scale, torch.float32) - x).abs() / x.abs().amax(-1, keepdim=True)
    assert float(err.max()) < (0.5 / 127 + 1e-6 if kind == "int8" else 0.07)


def step_logprobs(model, kind, prompts, tokens, suppress_eos):
    """Log-softmax of every decode step's logits with the completion ``tokens`` [n, T] forced
    (teacher forcing: both caches see the same prefix, so one flipped near-tie does not cascade)."""
    from transformers import DynamicCache

    from slimgrpo.rollout.decode import make_stepper
    from slimgrpo.rollout.engine import left_pad
    from slimgrpo.rollout.model_parts import CausalLMParts

    parts = CausalLMParts(model)
    with torch.no_grad():
        ids, mask = left_pad(prompts, 0, torch.device("cpu"))
        cache = DynamicCache(config=parts.config)
        positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)
        hidden = parts.decoder(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
                               past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        out = [parts.logits(hidden)]
        stepper = make_stepper(parts, cache, mask, tokens.shape[1], None, kind)
        for t in range(tokens.shape[1] - 1):
            out.append(parts.logits(stepper.step(tokens[:, t])))
    logits = torch.stack(out, 1).float()
    if suppress_eos:
        logits[..., 1] = float("-inf")  # as while generating with min_new_tokens = max_new_tokens
    return torch.log_softmax(logits, -1)  # [n, T, V]


def compare(model, kind, prompts, max_new, pinned):
    """(teacher-forced agreement, free-running agreement, mean and max |log-prob drift|) over the
    completion tokens of full-precision greedy decoding."""
    params = SamplingParams(max_new_tokens=max_new, min_new_tokens=max_new if pinned else 0, temperature=0.0,
                            eos_token_ids=(1,), pad_token_id=0)
    full = TorchRolloutEngine(model, pack_weights="none").generate(prompts, 1, params)
    tokens, mask = full.completion_ids, full.completion_mask
    ref = step_logprobs(model, "auto", prompts, tokens, pinned)
    assert torch.equal(ref.argmax(-1)[mask], tokens[mask])  # teacher forcing reproduces greedy decoding
    got = step_logprobs(model, kind, prompts, tokens, pinned)
    agree = float((got.argmax(-1) == tokens)[mask].float().mean())
    drift = (got.gather(-1, tokens[..., None]) - ref.gather(-1, tokens[..., None])).squeeze(-1).abs()[mask]
    quant = TorchRolloutEngine(model, kv_cache_dtype=kind, pack_weights="none").generate(prompts, 1, params)
    T = min(quant.completion_ids.shape[1], tokens.shape[1])
    free = float((quant.completion_ids[:, :T] == tokens[:, :T])[mask[:, :T]].float().mean())
    return agree, free, float(drift.mean()), float(drift.max()), int(mask.sum())


@pytest.mark.parametrize("kind", ["int8", "fp8_e4m3"])
def test_greedy_tokens_agree_with_the_full_precision_cache(kind):
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(DEMO), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(DEMO))
    rows = [json.loads(line) for line in (DEMO.parent / "data" / "eval.jsonl").read_text().splitlines()[:96]]
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    agree, free, mean, worst, n = compare(model, kind, prompts, 16, pinned=False)
    print(f"\n{kind}, demo task prompts: greedy tokens agree on {agree:.2%} of {n} (free-running {free:.2%}); "
          f"|log-prob drift| mean {mean:.2e}, max {worst:.2e}")
    assert agree >= 0.99 and free >= 0.99
    assert mean < 0.01
    # Stress: random prompts, 48 tokens pinned (EOS suppressed): flat distributions, many near-ties.
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(3, 12, (16,), generator=g)]
    agree, free, mean, worst, n = compare(model, kind, prompts, 48, pinned=True)
    print(f"{kind}, random prompts, 48 tokens pinned: greedy tokens agree on {agree:.2%} of {n} (free-running "
          f"{free:.2%}); |log-prob drift| mean {mean:.2e}, max {worst:.2e}")
    assert agree >= (0.99 if kind == "int8" else 0.9)


def test_quantised_cache_needs_a_llama_shaped_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with pytest.raises(ValueError, match="lean decode"):
        engine = TorchRolloutEngine(model, kv_cache_dtype="int8", lean_decode=False)
        engine.generate([[3, 4, 5]], 1, SamplingParams(max_new_tokens=2, eos_token_ids=(1,), pad_token_id=0))
