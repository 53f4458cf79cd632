"""Keep glibc's malloc from holding on to freed tensor memory (Linux, CPU runs).

PyTorch's CPU allocator is plain ``malloc``/``free``. glibc serves a request of at least
``M_MMAP_THRESHOLD`` bytes with its own ``mmap`` (given back to the system at ``free``) and smaller
ones from its heaps (kept by the process after ``free``, trimmed only from the top). The threshold
starts at 128 KiB but is *dynamic*: every ``free`` of an mmapped block raises it to that block's
size, up to 32 MiB. After the first update frees its activations, every tensor below 32 MiB comes
from the heaps, and one long-lived small block (a gradient, an optimizer moment, a cached tensor)
allocated between them pins the freed space under it: the process RSS grows past what is live.

Measured (the ``deep-lora-ckpt`` calibration shape: Llama, hidden 512, 8 layers, LoRA,
checkpointing, 8 x 128 completion tokens, 2 steps): peak RSS 1,325 MiB with glibc's default
behaviour, 820 MiB with the threshold pinned (plan: 932 MiB). Full fine-tuning probably shows it
less because its gradients and optimizer moments are large (mmapped) blocks.

``pin_mmap_threshold`` fixes the threshold at glibc's own starting value, 128 KiB (which also turns
the dynamic adjustment off), so that tensors of at least that size are mmapped and their memory goes
back to the system when they die. A 4 MiB threshold only took the peak above to 1,121 MiB: the
unpadded update allocates many per-row tensors of about a megabyte.

Decoding is the opposite case: every step allocates and frees the same few tensors (logits of
``rows x V``, several MiB for a large vocabulary) around very little compute, and mmapping each one
costs page faults every step (a W-cpu-sized head and softmax: 27 ms instead of 18 ms per step in a
micro-benchmark on a loaded machine). ``generation_heap()`` therefore raises the threshold to glibc's maximum (32 MiB,
where the dynamic threshold ends up anyway) while the rollout engine runs its decode loop, then pins it again
and hands the freed heap pages back (``malloc_trim``). Only the loop: what a generate call allocates once
(packed weights, the prefill's activations, the KV buffers, and their re-selection when finished rows leave:
``mapped()``) stays under the pinned threshold. Heap blocks of that size outlive the call as free space
in glibc's bins, which ``malloc_trim`` unmaps but glibc hands out again to later requests of any size (the
threshold only decides how the heap grows, not whether a free chunk is reused): the prepare and update that
follow touched them again and the gradients and optimizer moments allocated among them pinned them
(-713 MiB at the peak of a full fine-tune with a 3,500-token prompt once the generation heap was trimmed). ``SLIMGRPO_MALLOC_MMAP_THRESHOLD`` overrides the
value (bytes; ``0`` or ``off`` leaves glibc alone); a ``MALLOC_MMAP_THRESHOLD_`` set by the user for
glibc itself is respected. Other allocators (jemalloc or tcmalloc through ``LD_PRELOAD``) do not read
glibc's setting and are not affected.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

M_MMAP_THRESHOLD = -3  # mallopt parameter number (glibc malloc.h)
DEFAULT_MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's starting value
GENERATION_MMAP_THRESHOLD_BYTES = 32 * 1024**2  # glibc's DEFAULT_MMAP_THRESHOLD_MAX (64-bit)
ENV = "SLIMGRPO_MALLOC_MMAP_THRESHOLD"

_applied: int | None = None
_generating = False  # inside generation_heap


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only (musl has no dynamic threshold to fix)
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def requested_threshold() -> int | None:
    """The threshold to pin in bytes, or None to leave glibc alone (env override, see module doc)."""
    raw = os.environ.get(ENV)
    if raw is None:
        return None if "MALLOC_MMAP_THRESHOLD_" in os.environ else DEFAULT_MMAP_THRESHOLD_BYTES
    raw = raw.strip().lower()
    if raw in ("", "0", "off", "none", "false"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a byte count (e.g. 4194304) or 'off'") from None
    if value < 0:
        raise ValueError(f"{ENV}={raw!r}: expected a byte count >= 0 or 'off'")
    return value


def pin_mmap_threshold(threshold: int | None = -1) -> int | None:
    """Fix glibc's mmap threshold for this process; returns the value applied, or None if nothing was.

    ``threshold=-1`` (default) takes ``requested_threshold()``; ``None`` does nothing. Idempotent."""
    global _applied
    if threshold == -1:
        threshold = requested_threshold()
    if threshold is None:
        return None
    if _applied == threshold:
        return threshold
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold)):
        return None
    _applied = threshold
    return threshold


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Inside ``generation_heap``: the pinned threshold again for the block (a long-lived allocation such as the
    re-selected KV buffers); elsewhere nothing changes."""
    pinned, libc = _applied, _glibc()
    if pinned is None or libc is None or not _generating:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(pinned))
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(max(pinned, GENERATION_MMAP_THRESHOLD_BYTES)))


@contextlib.contextmanager
def generation_heap() -> Iterator[None]:
    """While generating: small-to-medium blocks from the heap (no page faults per decode step); on
    exit the pinned threshold again and the freed heap pages given back. Does nothing unless
    ``pin_mmap_threshold`` applied a threshold."""
    pinned, libc = _applied, _glibc()
    if pinned is None or libc is None:
        yield
        return
    global _generating
    libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(max(pinned, GENERATION_MMAP_THRESHOLD_BYTES)))
    _generating = True
    try:
        yield
    finally:
        _generating = False
        libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(pinned))
        libc.malloc_trim(ctypes.c_size_t(0))
