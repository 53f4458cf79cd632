"""Micro-batches of the update: which rows go together (by row count, ``memory.micro_batch_size``, or by a
token budget, ``memory.micro_batch_tokens``) and each one's rows as the loss takes them (``MicroBatch``).

``micro_batches(batch, settings, ranks)`` is the one iterator every pass over a batch takes: the policy's
log-probs without gradients, its entropy cut, its forward + backward, and PPO's critic (values and value
loss). Under FSDP2 (``settings.same_micro_count``) it asks the ranks for the largest count first, since
every forward and backward there is a collective.

Rows are unpadded (``forward/unpadded.py``): a micro-batch costs ``rows · longest row`` tokens of padded
work, not ``rows · (P + T)``. With a token budget, rows are sorted by length (longest first) and
filled greedily while ``rows · longest <= budget`` (and, when ``micro_batch_size`` is also set, at
most that many rows), so short completions do not pad to the longest of the step. A row longer than
the budget goes alone. The loss's normaliser holds whole-batch totals, so the summed micro-batch
losses (and gradients) equal the full-batch ones whatever the grouping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from slimgrpo.collectives import Collectives
from slimgrpo.forward.rows import CompletionRows
from slimgrpo.update.batch import UpdateBatch
from slimgrpo.update.settings import UpdateSettings


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens (prompt + completion) per row of a padded ``[rows, P + T]`` mask."""
    return attention_mask.bool().sum(dim=1)


def group_rows(lengths: torch.Tensor, micro_rows: int | None = None,
               micro_tokens: int | None = None) -> list[torch.Tensor]:
    """Row indices of each micro-batch.

    Without ``micro_tokens``: consecutive groups of ``micro_rows`` rows (all rows when None), in order.
    With ``micro_tokens``: rows sorted by length, longest first, packed greedily so that
    ``len(group) · max length in group <= micro_tokens``.
    """
    rows = int(lengths.shape[0])
    if micro_tokens is None:
        step = rows if not micro_rows else min(micro_rows, rows)
        return [torch.arange(i, min(i + step, rows)) for i in range(0, rows, max(step, 1))]
    if micro_tokens < 1:
        raise ValueError(f"micro_tokens must be >= 1, got {micro_tokens}")
    order = sorted(range(rows), key=lambda i: (-int(lengths[i]), i))
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = int(lengths[i])
        new_longest = max(longest, n)
        full = micro_rows is not None and len(current) >= micro_rows
        if current and (full or (len(current) + 1) * new_longest > micro_tokens):
            groups.append(current)
            current, new_longest = [], n
        current.append(i)
        longest = new_longest
    if current:
        groups.append(current)
    return [torch.tensor(sorted(g), dtype=torch.long) for g in groups]


def plan_micro(batch: UpdateBatch, settings: UpdateSettings, ranks: Collectives) -> list[torch.Tensor]:
    """Row indices of the micro-batches: ``settings.micro_rows`` rows at a time in order, or packed by the token
    budget ``settings.micro_tokens`` (``group_rows``). With ``settings.same_micro_count`` (FSDP2) as many
    micro-batches as the rank with the most (a token budget packs each rank's rows differently): the
    largest ones are halved."""
    groups = group_rows(row_lengths(batch.attention_mask).cpu(), settings.micro_rows, settings.micro_tokens)
    if settings.same_micro_count:
        groups = split_to_count(groups, ranks.max_over_ranks(len(groups)))
    return [rows.to(batch.input_ids.device) for rows in groups]


def split_to_count(groups: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """``groups`` with the largest halved until there are ``count`` (each keeps at least one row)."""
    groups = list(groups)
    while len(groups) < count:
        i = max(range(len(groups)), key=lambda j: len(groups[j]))
        if len(groups[i]) < 2:
            raise ValueError(f"cannot make {count} micro-batches of {sum(len(g) for g in groups)} rows")
        g = groups.pop(i)
        half = len(g) // 2
        groups[i:i] = [g[:half], g[half:]]
    return groups


def trimmed(batch: UpdateBatch, sl: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """Inputs of one micro-batch (a slice or row indices) without columns that are padding in every row of it.

    Returns (input_ids, attention_mask, completion_ids, tslice) where tslice selects the kept completion
    columns of the [rows, T] tensors."""
    ids, am = batch.input_ids[sl], batch.attention_mask[sl]
    P = ids.shape[1] - batch.T
    used_prompt = am[:, :P].any(dim=0).nonzero()
    start = int(used_prompt[0]) if used_prompt.numel() else 0
    comp_len = int(am[:, P:].sum(dim=1).max().item()) if batch.T else 0
    comp_len = max(comp_len, 1)
    end = P + comp_len
    return ids[:, start:end], am[:, start:end], batch.completion_ids[sl, :comp_len], slice(0, comp_len)


@dataclass
class MicroBatch:
    """The rows of one micro-batch (``trimmed``: no column that is padding in every row), as the loss takes them,
    with where they sit in the batch (``rows``, ``columns``: ``part`` cuts any [rows, T] tensor of the batch)."""

    input_ids: torch.Tensor  # [rows, P'+T']
    attention_mask: torch.Tensor  # [rows, P'+T']
    completion_ids: torch.Tensor  # [rows, T']
    loss_mask: torch.Tensor  # [rows, T'] bool
    advantages: torch.Tensor  # [rows], or [rows, T'] per token
    old_logp: torch.Tensor | None = None  # [rows, T']
    ref_logp: torch.Tensor | None = None  # [rows, T']
    entropy_cut: torch.Tensor | float | None = None  # the whole batch's threshold (top_entropy_quantile < 1)
    rows: torch.Tensor | slice = field(default_factory=lambda: slice(None))  # the batch's rows in this micro-batch
    columns: slice = field(default_factory=lambda: slice(None))  # the batch's completion columns kept ([:T'])

    @property
    def T(self) -> int:
        return int(self.completion_ids.shape[1])

    @property
    def completion_rows(self) -> CompletionRows:
        """The padded rows the forward layouts take (``forward/rows.py``), scored on their whole completions."""
        return CompletionRows(self.input_ids, self.attention_mask, self.T, self.completion_ids)

    def part(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """This micro-batch's part of a [rows, T] tensor of the batch (None stays None)."""
        return None if t is None else t[self.rows, self.columns]


def micro_batch(batch: UpdateBatch, sl: slice | torch.Tensor) -> MicroBatch:
    """The micro-batch of ``batch`` at ``sl`` (a slice or row indices), trimmed of all-padding columns."""
    ids, am, comp, ts = trimmed(batch, sl)
    part = lambda t: None if t is None else t[sl, ts]  # noqa: E731
    advantages = batch.advantages[sl, ts] if batch.advantages.dim() == 2 else batch.advantages[sl]
    return MicroBatch(ids, am, comp, batch.loss_mask[sl, ts], advantages, part(batch.old_logp), part(batch.ref_logp),
                      batch.entropy_cut, sl, ts)


@dataclass(frozen=True)
class MicroBatches:
    """The micro-batches of one batch, in order: how many (``len``, known before the first one runs: the
    entropy bonus's per-micro-batch mean and DDP's ``no_sync`` need it) and each one as the loss takes it
    (iterating builds them one at a time, so only the current one's slices are alive)."""

    batch: UpdateBatch
    groups: list[torch.Tensor]  # row indices of each micro-batch (``plan_micro``)

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator[MicroBatch]:
        for rows in self.groups:
            yield micro_batch(self.batch, rows)


def micro_batches(batch: UpdateBatch, settings: UpdateSettings, ranks: Collectives) -> MicroBatches:
    """The micro-batches of ``batch`` under ``settings`` (``plan_micro``); ``ranks``: the collectives the FSDP2
    count agreement asks (``settings.same_micro_count``; ``collectives.SINGLE`` for one process)."""
    return MicroBatches(batch, plan_micro(batch, settings, ranks))
