"""Micro-batches of the update: by row count (``memory.micro_batch_size``) or by a token budget
(``memory.micro_batch_tokens``).

Rows are unpadded (``loss.unpadded``): a micro-batch costs ``rows · longest row`` tokens of padded
work, not ``rows · (P + T)``. With a token budget, rows are sorted by length (longest first) and
filled greedily while ``rows · longest <= budget`` (and, when ``micro_batch_size`` is also set, at
most that many rows), so short completions do not pad to the longest of the step. A row longer than
the budget goes alone. The loss's normaliser holds whole-batch totals, so the summed micro-batch
losses (and gradients) equal the full-batch ones whatever the grouping.
"""

from __future__ import annotations

import torch


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens (prompt + completion) per row of a padded ``[rows, P + T]`` mask."""
    return attention_mask.bool().sum(dim=1)


def micro_batches(lengths: torch.Tensor, micro_rows: int | None = None,
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
