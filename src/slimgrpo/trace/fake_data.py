"""Run the real training step on fake tensors: the few rules that keep data-dependent code going.

``FakeTensorMode`` gives every float tensor a shape, a dtype and a storage size but no data, so an
8B model's step costs no memory. A GRPO step also branches on data (``int(mask.sum())``, row lengths
from masks, boolean indexing with completion masks, ``float(loss)``), which fake tensors cannot
answer. :class:`FakeData` sits above the fake mode and keeps those working:

* integer and boolean tensors (token ids, masks, indices, at most ``REAL_INDEX_LIMIT_BYTES`` each)
  are computed for real: an operator whose tensor inputs are all real runs for real, and a factory
  (``arange``, ``zeros``...) returning an integer or boolean tensor is re-run for real;
* a real boolean index into a fake tensor is turned into integer indices first (its ``nonzero`` is
  known), so ``hidden[mask]`` has a known shape;
* a Python scalar read from a fake tensor (``float(loss)``, ``bool(done.all())``) is a placeholder:
  ``1.0`` for floats (finite, so the optimizer step runs), ``1`` for integers, ``False`` for booleans;
* ``torch.equal`` with a fake tensor answers True: torch's own argument checks call it (torch 2.11's
  ``quantile`` compares ``all(0 <= q <= 1)`` with ones, on a fake scalar, before it sorts).

What the step computes is meaningless; what it allocates is what the real step allocates, except
where control flow depends on those placeholders (e.g. a rollout that stops at EOS: ``False`` means
no row ever ends, the worst case the planner also assumes).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
REAL_INDEX_LIMIT_BYTES = 64 * 2**20
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _placeholder(dtype: torch.dtype):
    if dtype == torch.bool:
        return False
    return 1.0 if dtype.is_floating_point or dtype.is_complex else 1


def _is_index_like(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex) and \
        t.numel() * t.element_size() <= REAL_INDEX_LIMIT_BYTES


class FakeData(TorchDispatchMode):
    """Enter inside an active ``FakeTensorMode(allow_non_fake_inputs=True)``; see the module docstring."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors(args, kwargs)
        any_fake = any(isinstance(x, FakeTensor) or x.is_meta for x in tensors)  # meta: a model not yet materialised
        if func is aten._local_scalar_dense.default and any_fake:
            return _placeholder(args[0].dtype)
        if func is aten.equal.default and any_fake:
            return True
        if tensors and not any_fake:  # all inputs real: index / mask arithmetic, run it for real
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func in _INDEX_OPS and any_fake:
            args = (args[0], _integer_indices(args[1]), *args[2:])
        out = func(*args, **kwargs)
        if not tensors and isinstance(out, torch.Tensor) and _is_index_like(out):
            with unset_fake_temporarily():  # a factory of ids / masks: make it real
                return func(*args, **kwargs)
        return out


def _tensors(args, kwargs) -> list[torch.Tensor]:
    """Tensor arguments, one list level deep (``cat``, ``index``): cheaper than a pytree flatten per op."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _integer_indices(indices):
    out = []
    for i in indices:
        if i is not None and not isinstance(i, FakeTensor) and i.dtype in (torch.bool, torch.uint8):
            with unset_fake_temporarily():
                out.extend(i.nonzero().unbind(1))
        else:
            out.append(i)
    return out
