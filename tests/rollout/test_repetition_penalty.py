"""repetition_penalty: the pure function against HF's RepetitionPenaltyLogitsProcessor, and the engine
against HF generate with the same penalty."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from slimgrpo.rollout import SamplingParams, TorchRolloutEngine
from slimgrpo.rollout.sampling import apply_repetition_penalty

from test_rollout import EOS, PAD, hf_greedy, tiny_model


@pytest.mark.parametrize("penalty", [1.3, 0.7, 1.0])
def test_matches_hf_processor(penalty: float) -> None:
    g = torch.Generator().manual_seed(0)
    N, V, L = 5, 37, 11  # a row may repeat a token: it is penalised once, as in HF
    input_ids = torch.randint(0, V, (N, L), generator=g)
    logits = torch.randn(N, V, generator=g) * 3
    seen = torch.zeros(N, V, dtype=torch.bool)
    seen[torch.arange(N)[:, None].expand(N, L), input_ids] = True
    expected = RepetitionPenaltyLogitsProcessor(penalty)(input_ids, logits.clone())
    torch.testing.assert_close(apply_repetition_penalty(logits, seen, penalty), expected, rtol=0, atol=0)


def test_engine_greedy_matches_hf_generate() -> None:
    model = tiny_model()
    prompts = [[5, 6, 7, 8], [12, 13, 14, 15]]  # same length: HF would also penalise left padding
    params = SamplingParams(max_new_tokens=12, temperature=0.0, eos_token_ids=(), pad_token_id=PAD,
                            repetition_penalty=1.8)
    ro = TorchRolloutEngine(model).generate(prompts, 1, params)
    ids = torch.tensor(prompts)
    hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                        pad_token_id=PAD, eos_token_id=EOS, repetition_penalty=1.8)[:, 4:]
    assert torch.equal(ro.completion_ids, hf)
    plain = TorchRolloutEngine(model).generate(prompts, 1, SamplingParams(
        max_new_tokens=12, temperature=0.0, eos_token_ids=(), pad_token_id=PAD))
    assert torch.equal(plain.completion_ids, hf_greedy(model, prompts, 12, eos=()))
    assert not torch.equal(plain.completion_ids, ro.completion_ids)  # the penalty changed something


def test_rejects_bad_penalty() -> None:
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(max_new_tokens=2, eos_token_ids=(), pad_token_id=0, repetition_penalty=0.0)
