"""The fast sampler draws from exactly the distribution HF generate's warpers define."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from slimgrpo.rollout.sampling import SamplingParams, SamplingWorkspace, sample_next

DRAWS = 20_000
LOGITS_12 = torch.tensor([1.3, -0.2, 0.7, 2.1, -1.5, 0.0, 1.9, -0.7, 0.4, 1.1, -2.3, 0.9])

CASES = {
    "plain": dict(),
    "temperature": dict(temperature=0.6),
    "hot": dict(temperature=1.7),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.15),
    "combined": dict(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05),
    "top_p_min_p": dict(temperature=1.3, top_p=0.95, min_p=0.1),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, one intra-op thread


def params(**kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=8, eos_token_ids=(0,), pad_token_id=0, **kw)


def reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Straightforward float64 reference: temperature -> top_k -> top_p -> min_p on one row [V]."""
    x = logits.double() / p.temperature
    keep = torch.ones_like(x, dtype=torch.bool)
    if p.top_k:
        kth = sorted(x.tolist(), reverse=True)[min(p.top_k, x.numel()) - 1]
        keep &= x >= kth
    if p.top_p < 1.0:
        probs = torch.softmax(x.masked_fill(~keep, -math.inf), -1)
        mass_before = 0.0
        for i in sorted(range(x.numel()), key=lambda i: -probs[i].item()):
            if mass_before >= p.top_p:
                keep[i] = False
            mass_before += probs[i].item()
    if p.min_p > 0:
        probs = torch.softmax(x.masked_fill(~keep, -math.inf), -1)
        keep &= probs >= p.min_p * probs.max()
    return torch.softmax(x.masked_fill(~keep, -math.inf), -1)


def hf_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The same distribution through Hugging Face's own warpers, in generate's order."""
    warpers = LogitsProcessorList()
    if p.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k:
        warpers.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        warpers.append(TopPLogitsWarper(p.top_p))
    if p.min_p > 0:
        warpers.append(MinPLogitsWarper(p.min_p))
    scores = warpers(torch.zeros(1, 1, dtype=torch.long), logits[None].float().clone())
    return torch.softmax(scores.double(), -1)[0]


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper chi-square quantile by the Wilson-Hilferty approximation (z=3.719: p = 1e-4)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_statistic(tokens: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    support = expected > 0
    assert counts[~support].sum() == 0, "drew a token the filters removed"
    exp_counts = expected[support] * tokens.numel()
    stat = ((counts[support] - exp_counts) ** 2 / exp_counts).sum().item()
    return stat, int(support.sum()) - 1


@pytest.mark.parametrize("name", list(CASES))
def test_distribution_matches_reference(name: str) -> None:
    p = params(**CASES[name])
    expected = reference_probs(LOGITS_12, p)
    # The reference agrees with HF's warpers (order and tie rules), so matching it means matching HF.
    torch.testing.assert_close(expected, hf_probs(LOGITS_12, p), atol=1e-6, rtol=0)
    gen = torch.Generator().manual_seed(1234)
    tokens, logprobs = sample_next(LOGITS_12.repeat(DRAWS, 1), p, gen)
    stat, df = chi2_statistic(tokens, expected)
    if df > 0:
        assert stat < chi2_critical(df), f"{name}: chi2={stat:.1f} df={df}"
    # Log-probs are those of the final (tempered, filtered, renormalised) distribution.
    torch.testing.assert_close(logprobs.double(), expected.log()[tokens], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7, min_p=0.01)])
def test_wide_rows_use_an_exact_two_level_search(kw: dict) -> None:
    """V=1037 is not a multiple of the 128-wide blocks: a short last block must be drawn correctly."""
    V = 1037
    logits = torch.full((V,), -1.0)
    special = torch.tensor([0, 127, 128, 300, 511, 512, 700, 899, 1023, 1024, 1030, 1036])
    logits[special] = torch.linspace(1.0, 3.2, special.numel())
    logits[5::97] = -30.0  # negligible tokens inside blocks
    p = params(**kw)
    expected = reference_probs(logits, p)
    tokens, logprobs = sample_next(logits.repeat(DRAWS, 1), p, torch.Generator().manual_seed(7))
    # Bins: each special token alone, the other tokens pooled per 128-wide block.
    bins = torch.arange(V) // 128 + special.numel()
    bins[special] = torch.arange(special.numel())
    exp_bins = torch.zeros(int(bins.max()) + 1, dtype=torch.float64).index_add_(0, bins, expected)
    stat, df = chi2_statistic(bins[tokens], exp_bins)
    assert stat < chi2_critical(df), f"chi2={stat:.1f} df={df}"
    torch.testing.assert_close(logprobs.double(), expected.log()[tokens], atol=1e-5, rtol=0)


def test_workspace_gives_identical_draws() -> None:
    logits = torch.randn(6, 3000)
    ws = SamplingWorkspace()
    for kw in (dict(), dict(temperature=0.5, min_p=0.05), dict(top_p=0.9)):
        a = sample_next(logits, params(**kw), torch.Generator().manual_seed(5))
        b = sample_next(logits, params(**kw), torch.Generator().manual_seed(5), workspace=ws)
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_top_p_on_a_large_flat_vocab(top_p: float) -> None:
    """Flat logits force the growing-topk search (and the full-sort fallback) to find the nucleus."""
    torch.manual_seed(0)
    logits = torch.randn(4, 5000) * 0.3
    p = params(top_p=top_p, temperature=0.9)
    tokens, logprobs = sample_next(logits, p, torch.Generator().manual_seed(0))
    for row in range(4):
        expected = reference_probs(logits[row], p)
        assert expected[tokens[row]] > 0
        torch.testing.assert_close(logprobs[row].double(), expected[tokens[row]].log(), atol=1e-4, rtol=0)


def test_top_k_keeps_ties_at_the_boundary_like_hf() -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 1.0, 1.0, 0.0, -1.0])
    p = params(top_k=3)
    expected = reference_probs(logits, p)
    torch.testing.assert_close(expected, hf_probs(logits, p), atol=1e-6, rtol=0)
    assert int((expected > 0).sum()) == 5
    tokens, _ = sample_next(logits.repeat(4000, 1), p, torch.Generator().manual_seed(0))
    assert set(tokens.unique().tolist()) == {0, 1, 2, 3, 4}


def test_greedy_and_masked_tokens() -> None:
    logits = torch.randn(5, 50)
    tokens, logprobs = sample_next(logits, params(temperature=0.0))
    assert torch.equal(tokens, logits.argmax(-1)) and torch.all(logprobs == 0)
    logits[:, :49] = -math.inf  # only token 49 is allowed
    tokens, logprobs = sample_next(logits, params(), torch.Generator().manual_seed(0))
    assert torch.all(tokens == 49) and torch.allclose(logprobs, torch.zeros(5))


def test_generator_makes_draws_reproducible() -> None:
    logits = torch.randn(8, 1000)
    a = sample_next(logits, params(top_k=20), torch.Generator().manual_seed(3))
    b = sample_next(logits, params(top_k=20), torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0])


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_new_tokens=0),
        dict(min_new_tokens=9),
        dict(temperature=-1.0),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(min_p=1.5),
        dict(eos_token_ids=(-1,)),
        dict(pad_token_id=-3),
    ],
)
def test_params_reject_bad_values(kw: dict) -> None:
    base = dict(max_new_tokens=8, eos_token_ids=(0,), pad_token_id=0)
    with pytest.raises(ValueError):
        SamplingParams(**{**base, **kw})


def test_params_normalise_off_values() -> None:
    p = SamplingParams(
        max_new_tokens=4, top_k=None, top_p=None, min_p=None, eos_token_ids=[2, 3], pad_token_id=0
    )
    assert (p.top_k, p.top_p, p.min_p, p.eos_token_ids) == (0, 1.0, 0.0, (2, 3))
    with pytest.raises(ValueError):
        sample_next(torch.zeros(3), p)
