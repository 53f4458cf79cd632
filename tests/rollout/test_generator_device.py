"""Issue 42, item 7: the tools demo passed a CPU generator to sampling on the model's device (CUDA: "Expected a
'cuda' device type for generator"). The demo now makes its generator where the model is, and sampling draws
with a generator of another device where that generator lives. No CUDA here: ``torch.rand`` is wrapped to
refuse a generator of another device, as CUDA's does, and a fake trainer says its model is on CUDA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slimgrpo.rollout import sampling
from slimgrpo.rollout.sampling import SamplingParams, sample_next


@pytest.fixture
def strict_rand(monkeypatch):
    """``torch.rand`` as CUDA's: a generator must be on the device it draws for."""
    original = torch.rand

    def rand(*size, generator=None, device=None, **kw):
        if generator is not None and torch.device(device or "cpu").type != generator.device.type:
            raise RuntimeError(f"Expected a '{torch.device(device).type}' device type for generator but found "
                               f"'{generator.device.type}'")
        return original(*size, generator=generator, device=device, **kw)

    monkeypatch.setattr(torch, "rand", rand)


def test_sampling_draws_where_the_generator_lives(strict_rand):
    params = SamplingParams(max_new_tokens=4, temperature=1.0, eos_token_ids=(1,), pad_token_id=0)
    logits = torch.randn(5, 300, device="meta")  # a device the CPU generator is not on (stands for CUDA)
    tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(0))
    assert tokens.shape == (5,) and tokens.device.type == "meta"
    # the numbers are the generator's own: the same as drawn on its device
    u = sampling.uniform(3, torch.device("meta"), torch.Generator().manual_seed(1))
    assert u.device.type == "meta" and u.shape == (3, 1)
    same = sampling.uniform(3, torch.device("cpu"), torch.Generator().manual_seed(1))
    assert torch.equal(same, torch.rand(3, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))


def test_tools_demo_makes_its_generator_on_the_model_device(monkeypatch):
    from slimgrpo.commands import demo_tools as tools_run

    made = []

    class FakeGenerator:
        def __init__(self, device="cpu"):
            self.device = torch.device(device)
            made.append(self)

        def manual_seed(self, seed):
            return self

    used = []

    def generate(batch, samples, params, generator):
        used.append(generator)
        rows = len(batch.prompts) * samples
        return SimpleNamespace(conversations=[[{"role": "assistant", "content": "4"}]] * rows)

    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    monkeypatch.setattr(tools_run, "tool_accuracy", lambda _, convs, answers: [1.0] * len(convs))
    tok = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    trainer = SimpleNamespace(policy=SimpleNamespace(device=torch.device("cuda", 0), tokenizer=tok),
                              cfg=SimpleNamespace(rollout=SimpleNamespace(max_completion_length=8)),
                              agent=SimpleNamespace(generate=generate))
    batch = SimpleNamespace(prompts=["1+1", "22+33"], columns={"answer": ["2", "55"]})
    dataset = type("Data", (), {"__len__": lambda self: 2, "batch": lambda self, idx: batch})()
    out = tools_run.measure(trainer, dataset, 1.0, 2, seed=7)
    assert out["accuracy"] == 1.0
    assert used and all(g.device == torch.device("cuda", 0) for g in used)
