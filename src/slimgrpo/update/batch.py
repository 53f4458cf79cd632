"""What the update works on: the rows of one step (``UpdateBatch``), their optimizer-step slices, and the
statistics that come back (``UpdateStats``). Micro-batches: ``micro.py``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from slimgrpo.collectives import Collectives
from slimgrpo.containers import LossStats, Rollout
from slimgrpo.loss.objectives import LossSettings, Normaliser


@dataclass(frozen=True)
class UpdateBatch:
    """Everything the loss needs for the rows of one step (this rank's share). Immutable: each stage of the update
    makes a new one (``dataclasses.replace``)."""

    input_ids: torch.Tensor  # [rows, P+T] prompt (left-padded) + completion (right-padded)
    attention_mask: torch.Tensor  # [rows, P+T]
    completion_ids: torch.Tensor  # [rows, T]
    loss_mask: torch.Tensor  # [rows, T] bool: completion tokens that count in the loss
    advantages: torch.Tensor  # [rows], or [rows, T] per token (PPO's GAE advantages)
    old_logp: torch.Tensor | None = None  # [rows, T] (num_iterations > 1)
    ref_logp: torch.Tensor | None = None  # [rows, T] (beta > 0)
    entropy_cut: torch.Tensor | None = None  # whole-batch entropy threshold (top_entropy_quantile < 1)
    old_values: torch.Tensor | None = None  # [rows, T] the critic's values at sampling time (PPO)
    returns: torch.Tensor | None = None  # [rows, T] the critic's targets, GAE advantages + values (PPO)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def T(self) -> int:
        return int(self.completion_ids.shape[1])


def make_update_batch(rollout: Rollout, advantages: torch.Tensor, mask_truncated: bool) -> UpdateBatch:
    prompt_ids, prompt_mask = rollout.row_prompt_ids()
    input_ids = torch.cat([prompt_ids, rollout.completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, rollout.completion_mask], dim=1).long()
    loss_mask = rollout.model_mask.clone()  # tool results stay in the context, out of the loss and KL
    if mask_truncated:
        loss_mask &= ~rollout.is_truncated.unsqueeze(1)
    return UpdateBatch(input_ids, attention_mask, rollout.completion_ids, loss_mask, advantages.float())


@dataclass
class UpdateStats(LossStats):
    """A loss evaluation's statistics (``LossStats``: token means, clip fractions over ``clip_count``, the
    entropy bonus's sum and tokens on this rank) over micro-batches, steps or ranks, with the summed loss
    and the completion tokens the means run over."""

    loss: float = 0.0
    tokens: int = 0


@dataclass(frozen=True)
class BatchTotals:
    """A batch's rows and loss tokens summed over every rank: what the policy's loss and the critic's value
    loss divide by, so that micro-batching and sharding leave both unchanged (``Updater.normaliser``,
    ``Critic.accumulate``)."""

    rows: int
    tokens: int


def batch_totals(batch: UpdateBatch, ranks: Collectives) -> BatchTotals:
    """``batch``'s rows and ``loss_mask`` tokens, summed over ``ranks`` (one all-reduce)."""
    counts = torch.tensor([batch.rows, int(batch.loss_mask.sum())], dtype=torch.float64)
    counts = ranks.all_reduce_sum(counts.to(batch.loss_mask.device)).cpu()
    return BatchTotals(int(counts[0]), int(counts[1]))


def policy_normaliser(batch: UpdateBatch, totals: BatchTotals, loss: LossSettings, world_size: int) -> Normaliser:
    """The policy loss's divisors for ``batch`` (this rank's share): ``totals``, its rows and tokens over every
    rank, so micro-batching and sharding leave the loss unchanged."""
    rows, tokens = totals.rows, totals.tokens
    # Entropy bonus: a mean over every rank's tokens; with top-entropy masks (whose counts are known only
    # inside the loss) a per-micro-batch mean, averaged over micro-batches and ranks as in TRL.
    whole = loss.top_entropy_quantile >= 1.0
    entropy = dict(entropy_tokens=max(tokens, 1) if whole else None, entropy_parts=1 if whole else world_size)
    if loss.loss_type == "bnpo":  # tokens of this rank's batch (TRL's "local batch")
        tokens = int(batch.loss_mask.sum()) * world_size
    return Normaliser(num_sequences=rows, num_tokens=max(tokens, 1), **entropy)


def split_update(batch: UpdateBatch, parts: int) -> list[UpdateBatch]:
    """``parts`` consecutive row slices of ``batch`` (``steps_per_generation``: one optimizer step each)."""
    if parts == 1:
        return [batch]
    if batch.rows < parts:
        raise ValueError(f"{batch.rows} completions on this process cannot feed loss.steps_per_generation={parts} "
                         "optimizer steps: raise run.batch_size or lower loss.steps_per_generation")
    bounds = torch.linspace(0, batch.rows, parts + 1).round().long().tolist()
    per_row = {f.name for f in dataclasses.fields(batch)} - {"entropy_cut"}  # the whole batch's
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = {k: None if getattr(batch, k) is None else getattr(batch, k)[a:b] for k in per_row}
        out.append(dataclasses.replace(batch, **rows))
    return out


def stat_sums(s: UpdateStats) -> dict[str, float]:
    """``s`` as sums that add across micro-batches, optimizer steps and ranks: the loss (and its policy part), the
    token means times the tokens, the clip fractions and the loss type's ``extra`` (``extra:NAME``) times what
    they count."""
    n, c = float(s.tokens), float(s.clip_count)
    sums = {"loss": s.loss, "policy_loss": s.policy_loss, "kl": s.kl * n, "entropy": s.entropy * n, "tokens": n,
            "clip_ratio_low": s.clip_ratio_low * c, "clip_ratio_high": s.clip_ratio_high * c,
            "clip_ratio_region": s.clip_ratio_region * c, "clip_count": c}
    sums.update({f"extra:{k}": v * c for k, v in s.extra.items()})
    return sums


def add_sums(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """Two ``stat_sums`` added, key by key (a key one side lacks counts 0)."""
    return {k: total.get(k, 0.0) + part.get(k, 0.0) for k in {**total, **part}}


def token_means(sums: dict[str, float]) -> UpdateStats:
    """The one token-weighted reduction: ``stat_sums`` added over parts (micro-batches, optimizer steps or
    ranks) back to statistics: token means over the tokens, clip fractions and ``extra`` over what they
    count, the loss summed."""
    d, dc = max(sums["tokens"], 1.0), max(sums["clip_count"], 1.0)
    return UpdateStats(loss=sums["loss"], policy_loss=sums.get("policy_loss", 0.0), kl=sums["kl"] / d,
                       entropy=sums["entropy"] / d,
                       clip_ratio_low=sums["clip_ratio_low"] / dc, clip_ratio_high=sums["clip_ratio_high"] / dc,
                       clip_ratio_region=sums["clip_ratio_region"] / dc, tokens=int(sums["tokens"]),
                       clip_count=int(sums["clip_count"]),
                       extra={k[len("extra:"):]: v / dc for k, v in sums.items() if k.startswith("extra:")})


def merge_stats(parts: list[UpdateStats]) -> UpdateStats:
    """Statistics of several optimizer steps as one: the loss averaged over steps, token means
    weighted by tokens, clip fractions by what they count (``token_means``)."""
    if len(parts) == 1:
        return parts[0]
    sums = stat_sums(parts[0])
    for p in parts[1:]:
        sums = add_sums(sums, stat_sums(p))
    out = token_means(sums)
    out.loss /= len(parts)
    out.policy_loss /= len(parts)
    return out
