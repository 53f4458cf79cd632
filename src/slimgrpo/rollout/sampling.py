"""Fast, exact token sampling for large vocabularies.

``torch.multinomial`` over a 152K-token vocabulary is the single most expensive operation of a CPU
decode step (tens of milliseconds for 8 rows). Inverse-CDF sampling gives the same distribution for a
fraction of the cost: exponentiate once, draw one uniform number per row and binary-search it in the
cumulative mass (``searchsorted``) -- in two levels for wide rows (128-token blocks, then a token in
the chosen block), so no float64 prefix sum over the whole vocabulary is ever written. Filters that
need a ranking (top-k, top-p) use a partial ``topk`` instead of a full sort, because the kept set is
almost always tiny compared with the vocabulary (a flat distribution under top-p still ends in a sort).

The warpers follow Hugging Face ``generate`` (transformers 5.x) in its order and tie rules:

    temperature  ->  top_k  ->  top_p  ->  min_p

* top_k keeps every token whose logit is >= the k-th largest logit (ties at the boundary survive);
* top_p keeps the smallest prefix of the descending-probability ranking whose mass reaches ``top_p``
  (a token is kept when the mass strictly before it is < ``top_p``), computed after top_k;
* min_p keeps tokens whose probability is >= ``min_p`` times the largest probability, after top_p.

The returned log-probability is that of the chosen token under the final (tempered, filtered,
renormalised) distribution, which is what an importance-sampling correction needs. Greedy decoding
(temperature 0) is a point mass: its log-probability is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Candidate-set sizes tried by top-p before falling back to a full sort. Trained models put the
# nucleus in the top few dozen tokens; flat (e.g. random-init) distributions end in the sort.
_TOP_P_K_SCHEDULE = (64, 1024)
# Block width of the two-level inverse-CDF search over wide rows.
_BLOCK = 128


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How completions are sampled. Field names follow TRL / Hugging Face ``generate``.

    ``None`` for ``top_k`` / ``min_p`` / ``top_p`` means "off", like 0 / 0.0 / 1.0.
    """

    max_new_tokens: int
    """Most completion tokens per row (TRL: ``max_completion_length``)."""
    min_new_tokens: int = 0
    """EOS is forbidden before this many tokens were generated (pin it to ``max_new_tokens`` to benchmark)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding (argmax)."""
    top_p: float | None = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    top_k: int | None = 0
    """Keep only the k most likely tokens; 0 or None disables it."""
    min_p: float | None = 0.0
    """Drop tokens less likely than ``min_p`` x the most likely one; 0 or None disables it."""
    repetition_penalty: float = 1.0
    """Hugging Face's repetition penalty on every token already in the prompt or the completion (1 = off)."""
    eos_token_ids: tuple[int, ...]
    """Token ids that end a completion (the EOS itself is part of the completion)."""
    pad_token_id: int
    """Id written after EOS and used to left-pad prompts."""

    def __post_init__(self) -> None:
        # Normalise the "off" spellings so the sampler only has to look at one value.
        set_ = object.__setattr__
        set_(self, "top_p", 1.0 if self.top_p is None else float(self.top_p))
        set_(self, "top_k", 0 if self.top_k is None else self.top_k)
        set_(self, "min_p", 0.0 if self.min_p is None else float(self.min_p))
        set_(self, "temperature", float(self.temperature))
        eos = self.eos_token_ids
        set_(self, "eos_token_ids", (eos,) if isinstance(eos, int) else tuple(eos))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.min_new_tokens, int) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be an int in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens!r}"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if not all(isinstance(t, int) and t >= 0 for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must be non-negative ints, got {self.eos_token_ids!r}")
        if not isinstance(self.pad_token_id, int) or self.pad_token_id < 0:
            raise ValueError(f"pad_token_id must be a non-negative int, got {self.pad_token_id!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Hugging Face's ``RepetitionPenaltyLogitsProcessor`` (CTRL, Keskar et al. 2019) on raw logits.

    For every token already present in the row (``seen[n, v]``; prompt and completion so far), a positive
    logit is divided by ``penalty`` and a negative one multiplied by it, so ``penalty > 1`` makes
    repeats less likely. Applied before temperature, as ``generate`` does. Returns a new tensor.

    Args:
        logits: ``[N, V]`` next-token scores.
        seen: ``[N, V]`` bool, True where the token occurred in the row.
        penalty: > 0; 1 returns the logits unchanged.
    """
    if penalty == 1.0:
        return logits
    scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, scaled, logits)


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    workspace: SamplingWorkspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    Args:
        logits: ``[N, V]`` raw next-token scores (any float dtype; computed in float32). ``-inf`` entries
            are never drawn (the engine uses this to forbid EOS before ``min_new_tokens``).
        params: temperature / top_k / top_p / min_p settings.
        generator: optional RNG for reproducible draws, best on ``logits.device`` (one on another device
            draws there and the numbers are copied over: ``uniform``).
        workspace: optional scratch buffers reused across calls (a decode loop passes one; see
            ``SamplingWorkspace``). Results are identical with or without it.

    Returns:
        ``(tokens [N] long, logprobs [N] float32)``. Greedy decoding (temperature 0) returns the argmax
        and a log-probability of 0 (the greedy distribution is a point mass).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if params.greedy:
        tokens = logits.argmax(dim=-1)  # [N]
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)

    ws = workspace if workspace is not None else SamplingWorkspace()
    x = logits.float()  # [N, V]
    if params.temperature != 1.0:
        x = torch.div(x, params.temperature, out=ws.get("scaled", x.shape, torch.float32, x.device))
    V = x.shape[-1]
    top_k = params.top_k if params.top_k < V else 0  # k >= V keeps everything: same as off

    if top_k == 0 and params.top_p >= 1.0:
        m = x.amax(dim=-1, keepdim=True)  # [N, 1]
        drop = None
        if params.min_p > 0.0:
            # p_i < min_p * p_max  <=>  x_i < x_max + log(min_p)
            drop = torch.lt(x, m + math.log(params.min_p), out=ws.get("drop", x.shape, torch.bool, x.device))
        return _sample_inverse_cdf(x, m, drop, generator, ws)

    # Ranked filters work on a short descending candidate list instead of the whole vocabulary.
    if top_k > 0:
        vals, idx, keep = _top_k_candidates(x, top_k)  # [N, K] each
        log_norm = torch.logsumexp(vals.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
    else:
        vals, idx, log_norm = _top_p_candidates(x, params.top_p)  # [N, K], [N, K], [N, 1]
        keep = torch.ones_like(vals, dtype=torch.bool)
    if params.top_p < 1.0:
        keep = keep & (_mass_before(vals, keep, log_norm) < params.top_p)
    if params.min_p > 0.0:
        # The best candidate (column 0) always survives the earlier filters.
        keep = keep & (vals >= vals[:, :1] + math.log(params.min_p))
    pos, logprobs = _sample_inverse_cdf(vals, vals[:, :1], ~keep, generator, None)  # candidate positions
    return idx.gather(-1, pos[:, None]).squeeze(-1), logprobs


def _sample_inverse_cdf(
    x: torch.Tensor,
    x_max: torch.Tensor,
    drop: torch.Tensor | None,
    generator: torch.Generator | None,
    ws: SamplingWorkspace | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample column indices of ``x`` ([N, K] float32) with probability proportional to ``exp(x)``.

    ``x_max`` [N, 1] is the row maximum (never dropped); ``drop`` [N, K] marks excluded columns.
    Wide rows use a two-level inverse CDF: pick a block of ``_BLOCK`` columns by its mass, then a column
    inside it, reusing the leftover of the same uniform number. That costs one ``exp`` pass and one
    block-sum pass over the row, where a flat CDF would also write and scan a float64 prefix sum.
    """
    N, K = x.shape
    ws = ws if ws is not None else SamplingWorkspace()
    w = torch.sub(x, x_max, out=ws.get("weights", x.shape, torch.float32, x.device))
    w.exp_()  # [N, K] in [0, 1]
    if drop is not None:
        w.masked_fill_(drop, 0.0)
    u = uniform(N, x.device, generator)  # [N, 1] in [0, 1)
    if K < 4 * _BLOCK:
        pos, _, total = _pick(w, u)  # [N, 1]
    else:
        n_full = K // _BLOCK
        block_mass = w[:, : n_full * _BLOCK].view(N, n_full, _BLOCK).sum(-1)  # [N, n_full]
        if K > n_full * _BLOCK:  # a last, shorter block
            block_mass = torch.cat([block_mass, w[:, n_full * _BLOCK :].sum(-1, keepdim=True)], dim=1)
        block, u, total = _pick(block_mass, u)  # [N, 1] chosen block, leftover uniform
        cols = block * _BLOCK + torch.arange(_BLOCK, device=x.device)  # [N, B] columns of the block
        inside = cols < K
        block_w = w.gather(1, cols.clamp(max=K - 1)).masked_fill_(~inside, 0.0)  # [N, B]
        offset, _, _ = _pick(block_w, u)
        pos = cols.gather(1, offset)  # [N, 1]
    chosen = x.gather(-1, pos).squeeze(-1)  # [N]
    logprobs = (chosen - x_max.squeeze(-1)).double() - torch.log(total.squeeze(-1))
    return pos.squeeze(-1), logprobs.float()


def uniform(n: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """``[n, 1]`` float64 uniform numbers in [0, 1) on ``device``, drawn by ``generator``. A generator lives
    on one device and ``torch.rand`` refuses another's (a CPU generator for CUDA logits raised "Expected a
    'cuda' device type for generator"): the numbers are then drawn where the generator is and moved, the
    same numbers that generator gives on its own device."""
    if generator is None or generator.device == torch.device(device):
        return torch.rand(n, 1, dtype=torch.float64, device=device, generator=generator)
    return torch.rand(n, 1, dtype=torch.float64, device=generator.device, generator=generator).to(device)


def _pick(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw of one column of ``weights`` ([N, M] >= 0) per row from ``u`` ([N, 1] in [0, 1)).

    Returns ``(index [N, 1], leftover [N, 1], total [N, 1])``: ``leftover`` is where ``u`` fell inside
    the chosen column's share, rescaled to [0, 1) -- a fresh uniform number for a second-level draw.
    """
    cdf = weights.double().cumsum(dim=-1)  # [N, M]
    total = cdf[:, -1:]  # [N, 1]
    # The target must stay strictly below the total, or searchsorted would step past the last column.
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target, right=True)  # [N, 1] first column with cdf > target: weight > 0
    # NaN/inf weights (a diverged model) would step past the end: keep the index valid and let the NaN
    # reach the log-probs, where the trainer's non-finite guard stops the run with its diagnosis.
    idx = idx.clamp_(max=weights.shape[-1] - 1)
    before = torch.where(idx > 0, cdf.gather(-1, (idx - 1).clamp(min=0)), torch.zeros_like(target))
    share = cdf.gather(-1, idx) - before  # [N, 1] > 0
    leftover = ((target - before) / share).clamp(min=0.0)
    leftover = torch.minimum(leftover, torch.full_like(leftover, 1.0 - 2.0**-53))
    return idx, leftover, total


class SamplingWorkspace:
    """Scratch buffers reused from one ``sample_next`` call to the next.

    A decode step over a 152K vocabulary needs ~30 MB of temporaries; allocating them afresh every
    step makes the C allocator hand pages back to the OS and fault them in again, which on CPU costs
    more than the arithmetic. Buffers grow to the largest size seen and are sliced for smaller ones.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(
        self, name: str, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (contents undefined) backed by the buffer ``name``."""
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)


def _top_k_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` best tokens per row, plus any ties of the k-th (HF keeps all of them).

    Returns ``(vals [N, K], idx [N, K], keep [N, K])`` sorted descending; ``K >= k`` only with ties.
    """
    vals, idx = torch.topk(x, k, dim=-1)  # [N, k] sorted descending
    kth = vals[:, -1:]  # [N, 1]
    n_tied = int((x >= kth).sum(dim=-1).max())
    if n_tied > k:  # rare: exact ties at the boundary; widen the candidate list to hold them
        vals, idx = torch.topk(x, n_tied, dim=-1)
    return vals, idx, vals >= kth


def _top_p_candidates(x: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A descending prefix of the ranking that is sure to contain every token top_p keeps.

    Grows a partial ``topk`` until each row's candidates hold at least ``top_p`` of the mass (then the
    next token has >= top_p before it and is dropped); falls back to a full sort.

    Returns ``(vals [N, K], idx [N, K], log_norm [N, 1])`` with ``log_norm`` the log-partition of
    the full row, so candidate probabilities are ``exp(vals - log_norm)``.
    """
    V = x.shape[-1]
    log_norm = torch.logsumexp(x, dim=-1, keepdim=True)  # [N, 1]
    for k in _TOP_P_K_SCHEDULE:
        if k * 4 >= V:
            break
        vals, idx = torch.topk(x, k, dim=-1)  # [N, k]
        mass = torch.exp(vals - log_norm).sum(dim=-1)  # [N]
        if bool((mass >= top_p).all()):
            return vals, idx, log_norm
    vals, idx = x.sort(dim=-1, descending=True)
    return vals, idx, log_norm


def _mass_before(vals: torch.Tensor, keep: torch.Tensor, log_norm: torch.Tensor) -> torch.Tensor:
    """Probability mass strictly before each candidate ([N, K]), tokens outside ``keep`` weighing 0.

    ``vals`` is sorted descending and ``exp(vals - log_norm)`` are the probabilities (normalised over
    the whole support, which may extend past the candidate list).
    """
    p = torch.exp(vals - log_norm).masked_fill(~keep, 0.0).double()  # [N, K]
    return torch.cumsum(p, dim=-1) - p
