"""Static-cache decode (rollout/cuda_graph.py): the logic on CPU (graphs off) against the dynamic path."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.rollout import SamplingParams, TorchRolloutEngine
from slimgrpo.rollout import engine as engine_mod
from slimgrpo.rollout.cuda_graph import ENV, StaticCacheStepper, enabled
from slimgrpo.rollout.decode import LlamaStepper

from test_rollout import PROMPTS, hf_greedy, padded, tiny_model  # noqa: E402


@pytest.fixture
def static_stepper(monkeypatch):
    """Make the engine decode with StaticCacheStepper (graphs off: the CPU path of the same logic)."""
    made = []

    def make(parts, cache, prompt_mask, max_new, lean, kv_cache_dtype=None):
        made.append(StaticCacheStepper(parts, cache, prompt_mask, max_new, graphs=False))
        return made[-1]

    monkeypatch.setattr(engine_mod, "make_stepper", make)
    return made


def greedy(max_new, eos=()):
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, eos_token_ids=eos, pad_token_id=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_static_cache_greedy_equals_dynamic_and_hf(arch, static_stepper):
    model = tiny_model(arch=arch)
    ro = TorchRolloutEngine(model).generate(PROMPTS, 2, greedy(12))
    assert static_stepper and static_stepper[0].t == 11  # the static stepper really decoded
    assert torch.equal(ro.completion_ids, hf_greedy(model, PROMPTS, 12, eos=()).repeat_interleave(2, dim=0))


def test_static_cache_with_dropped_rows(static_stepper):
    """Rows that end early leave the batch (select); the rest continue as with the dynamic stepper."""
    model = tiny_model(arch="llama")
    free = hf_greedy(model, PROMPTS, 12, eos=())
    eos = (int(free[0, 2]), int(free[2, 5]))
    ro = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, greedy(12, eos))
    expected = hf_greedy(model, PROMPTS, 12, eos=eos).repeat_interleave(2, dim=0)
    assert torch.equal(ro.completion_ids, padded(expected, ro.completion_ids.shape[1]))
    assert ro.completion_lengths.min() < 12  # some rows ended early


def test_static_step_hidden_matches_lean_step():
    from transformers import DynamicCache

    from slimgrpo.rollout.model_parts import CausalLMParts

    model = tiny_model(arch="qwen2")
    parts = CausalLMParts(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = ids.ne(0) | torch.tensor([[False] * 5, [True] * 5])
    hidden = []
    for cls in (LlamaStepper, StaticCacheStepper):
        cache = DynamicCache(config=parts.config)
        with torch.no_grad():
            parts.decoder(input_ids=ids, attention_mask=mask.long(), position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                          past_key_values=cache, use_cache=True)
            stepper = cls(parts, cache, mask, 6)
            if cls is StaticCacheStepper:  # attention reads unwritten columns: they must be finite (zeros)
                assert all(bool(b[:, :, 5:].eq(0).all()) for b in (*stepper.keys, *stepper.values))
            hidden.append(torch.stack([stepper.step(torch.tensor([3 + t, 40 + t])) for t in range(6)]))
    torch.testing.assert_close(hidden[1], hidden[0], rtol=1e-5, atol=1e-5)


def test_enabled_only_on_cuda_and_opt_in(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    assert enabled(torch.device("cuda")) and not enabled(torch.device("cpu"))
    monkeypatch.setenv(ENV, "0")
    assert not enabled(torch.device("cuda"))


def test_graphs_refused_on_cpu():
    from transformers import DynamicCache

    from slimgrpo.rollout.model_parts import CausalLMParts

    parts = CausalLMParts(tiny_model())
    cache = DynamicCache(config=parts.config)
    ids = torch.tensor([[5, 6]])
    with torch.no_grad():
        parts.decoder(input_ids=ids, past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="CUDA"):
        StaticCacheStepper(parts, cache, torch.ones_like(ids, dtype=torch.bool), 4, graphs=True)
