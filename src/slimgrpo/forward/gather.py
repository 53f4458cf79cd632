"""Row gathers whose backward sums in a fixed order, so that a run repeats bit for bit.

The update gathers rows with repeated indices: every completion of a group starts from its prompt's last
hidden state (packed and shared-prompt layouts), and the shared-prompt layout fans each group's keys and
values out to its rows. Written as ``x[index]``, the backward of such a gather is ``index_put_`` with
``accumulate=True``, which on CPU adds the repeated rows with parallel atomic float adds once the
gathered tensor has 32,768 elements or more and torch has more than one thread: the order of those adds
is the order the threads happen to reach them, so the gradient changes in its last bits from call to call
and run to run, and a GRPO run amplifies that into a different run after a few steps.

``take_rows`` gives the same values and gradients through a backward whose order is fixed on every
device: on CPU ``index_select`` (its backward ``index_add_`` runs the indices in order), elsewhere
advanced indexing (CUDA's accumulating ``index_put_`` sorts the indices first; its ``index_add_`` would
use atomics).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # layers holding per-row convolution and recurrent states (Mamba, gated delta nets)
    from transformers.cache_utils import LinearAttentionCacheLayerMixin as _LINEAR_ATTENTION
except ImportError:  # a transformers without them
    _LINEAR_ATTENTION = ()


def take_rows(x: Tensor, index: Tensor, dim: int = 0) -> Tensor:
    """``x`` indexed by the 1-D long tensor ``index`` along ``dim`` (repeats allowed), with a
    deterministic backward (module docstring). Equal to ``x.index_select(dim, index)``."""
    if x.device.type == "cpu":
        return x.index_select(dim, index)
    return x[(slice(None),) * dim + (index,)]


def select_cache_rows(cache, index: Tensor) -> None:
    """``cache.batch_select_indices(index)`` for a transformers cache: every layer keeps the rows ``index``
    (repeats allowed: a prompt fanned out to its completions). A ``DynamicCache`` layer's keys and values go
    through ``take_rows``, so the gradient that flows back into the shared keys and values is summed in a fixed
    order. A linear-attention or state-space layer (Mamba's in NemotronH, Qwen3-Next's gated delta net) keeps
    convolution and recurrent states per row that ``batch_select_indices`` leaves behind (or lacks altogether),
    so it is moved with its ``reorder_cache``, which selects every state it holds (keys and values too, for a
    layer holding both). Layers of other cache types use their own ``batch_select_indices``."""
    for layer in getattr(cache, "layers", None) or []:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer).__name__ == "DynamicLayer" and isinstance(keys, Tensor) and isinstance(values, Tensor):
            if keys.numel():
                layer.keys, layer.values = take_rows(keys, index), take_rows(values, index)
        elif isinstance(layer, _LINEAR_ATTENTION):
            layer.reorder_cache(index)
        else:
            layer.batch_select_indices(index)
    if not getattr(cache, "layers", None):
        cache.batch_select_indices(index)


__all__ = ["select_cache_rows", "take_rows"]
