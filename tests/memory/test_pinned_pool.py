"""Pinned host memory equals the plan: activation offload holds exact-size buffers from a
pool (memory/pinned.py), not power-of-two blocks of torch's caching host allocator, and the plan's host
line is what the pool holds. The driver's pinning is replaced by functions that do nothing (no CUDA here)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from slimgrpo.runspec.run import RunSpec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.trace.synthetic import UpdateOnly, random_causal_lm, synthetic_rollout, update_config
from slimgrpo.update import gradients
from slimgrpo.update.offload import AsyncOffload
from slimgrpo.memory import pinned
from slimgrpo.memory.pinned import PAGE, PinFailed, PinnedPool, page_aligned_empty

SRC = Path(__file__).resolve().parents[2] / "src" / "slimgrpo"


def pages(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


def _pool(pinned: list | None = None) -> PinnedPool:
    pinned = pinned if pinned is not None else []
    return PinnedPool(pin=lambda t: pinned.append(t.numel()), unpin=lambda t: pinned.remove(t.numel()))


def test_pool_holds_exact_sizes_and_reuses_them():
    pinned: list[int] = []
    pool = _pool(pinned)
    size = 9234 * 64  # 590,976 B, not a power of two: the caching host allocator would hold 2**20
    a, la = pool.acquire((size // 4,), torch.float32)
    b, lb = pool.acquire((size // 2,), torch.bfloat16)
    assert a.shape == (size // 4,) and b.dtype == torch.bfloat16
    assert pool.bytes_held == 2 * size  # the bytes asked for (the plan's), no power-of-two rounding
    assert pinned == [pages(size)] * 2  # each pinned as its own whole pages
    del la, lb  # autograd dropped the saved tensors: the buffers go back
    a, la = pool.acquire((size // 4,), torch.float32)
    b, lb = pool.acquire((size // 8,), torch.float32)  # smaller: served by the other free buffer
    assert pool.bytes_held == 2 * size and len(pinned) == 2  # the next step reuses them


def test_pool_gives_back_buffers_too_small_for_a_larger_step():
    pinned: list[int] = []
    pool = _pool(pinned)
    leases = [pool.acquire((1024,), torch.float32)[1] for _ in range(3)]
    del leases
    leases = [pool.acquire((1536,), torch.float32)[1] for _ in range(3)]  # longer rows this step
    assert pool.bytes_held == 3 * 6144 and sum(pinned) == 3 * pages(6144)  # the small ones were released
    del leases
    pool.trim()
    assert pool.bytes_held == 0 and pinned == []


def test_no_two_buffers_share_a_page():
    """The driver locks whole pages: a buffer that shared a page with another would make the second registration
    fail. Every buffer starts on a page and spans whole pages, however small the tensors (the pinning call
    stubbed: the layout is what is checked)."""
    regions = []
    pool = PinnedPool(pin=lambda t: regions.append((t.data_ptr(), t.numel())), unpin=lambda t: None)
    leases = [pool.acquire((n,), torch.float32)[1] for n in (1, 3, 100, 1000, 1025, 7)]
    assert all(start % PAGE == 0 and size % PAGE == 0 and size >= PAGE for start, size in regions)
    pages_of = [set(range(start // PAGE, (start + size) // PAGE)) for start, size in regions]
    assert all(not (a & b) for i, a in enumerate(pages_of) for b in pages_of[i + 1:])
    del leases
    host = page_aligned_empty(10)
    assert host.data_ptr() % PAGE == 0 and host.numel() == PAGE


def test_a_refused_pin_falls_back_to_pageable_memory_once_said(caplog):
    def refuse(t):
        raise PinFailed("cudaHostRegister of 4,096 bytes failed (cudaError 712)")

    unpinned = []
    pool = PinnedPool(pin=refuse, unpin=unpinned.append)
    pinned._warned_unpinned.clear()
    with caplog.at_level("WARNING", logger="slimgrpo"):
        kept = [pool.acquire((100,), torch.float32) for _ in range(3)]
    assert all(lease is not None for _, lease in kept)  # served, in pageable memory
    assert sum("pageable memory" in r.message for r in caplog.records) == 1
    del kept
    pool.trim()
    assert unpinned == []  # never registered: nothing to unregister


def test_a_failed_registration_clears_the_pending_error(monkeypatch):
    """``cudaHostRegister`` failing leaves its error pending in the runtime; the next kernel would raise it. The
    error is read off (cudaGetLastError) before PinFailed is raised (the runtime stubbed)."""
    calls = []

    class Runtime:
        def cudaHostRegister(self, ptr, nbytes, flags):
            calls.append("register")
            return 712

        def cudaGetLastError(self):
            calls.append("clear")
            return 712

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Runtime())
    with pytest.raises(PinFailed, match="cudaError 712"):
        pinned.register_host(page_aligned_empty(100))
    assert calls == ["register", "clear"]


def test_pool_cap_overflows_into_unpinned_memory():
    pool = _pool()
    pool.cap_bytes = 8192
    kept = [pool.acquire((1024,), torch.float32) for _ in range(2)]
    host, lease = pool.acquire((1024,), torch.float32)
    assert lease is None and pool.bytes_held == 8192 and pool.overflow_bytes == 4096 and host.shape == (1024,)
    assert kept


def test_offload_allocates_no_caching_host_allocator_blocks():
    """The CUDA path's host buffers come from the pool: ``pin_memory=True`` (the caching host allocator,
    power-of-two blocks) appears nowhere in the offload code."""
    for name in ("update/offload.py", "memory/pinned.py"):
        tree = ast.parse((SRC / name).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        pins = [kw for c in calls for kw in c.keywords if kw.arg == "pin_memory"
                and isinstance(kw.value, ast.Constant) and kw.value.value is True]
        pins += [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "pin_memory"]
        assert not pins, f"{name} allocates pinned memory through torch's caching host allocator"


def test_tensor_saved_twice_is_copied_once():
    x = torch.randn(64, 32, requires_grad=True)
    with AsyncOffload(min_bytes=0, device_types=("cpu",), pool=_pool()) as h:
        y = x * 2
        z = (y * y).sum()  # mul saves y twice
    assert h.offloaded == 1
    z.backward()
    assert torch.equal(x.grad, 8 * x.detach())


TINY = ModelShape(family="qwen2", hidden=64, intermediate=96, layers=3, heads=4, kv_heads=2, vocab=97, tie=True,
                  max_positions=4096)
MIN_BYTES = 16 << 10  # offload's threshold, 1 MiB in a run, lowered so that a small step has tensors above it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plan_host_line_equals_pool_bytes(monkeypatch, dtype):
    """One update step with checkpointing and offload, two micro-batches: the pool holds what the plan's
    "offloaded checkpoints" line says, to the byte (tensors of >= MIN_BYTES only, as the planner counts them)."""
    from slimgrpo.update import costs

    monkeypatch.setattr(costs, "OFFLOAD_MIN_BYTES", MIN_BYTES)
    pool = _pool()
    hooks = []

    def offloading(enabled, device, target=None):
        hooks.append(AsyncOffload(min_bytes=MIN_BYTES, device_types=("cpu",), pool=pool))
        return hooks[-1]

    monkeypatch.setattr(gradients, "offload_context", offloading)
    m, P, T = 2, 40, 100
    cfg = update_config({"memory": {"gradient_checkpointing": True, "offload_activations": True,
                                    "micro_batch_size": m, "tiled_mlp": "off"},
                         "rollout": {"num_generations": 4, "max_completion_length": T},
                         "data": {"max_prompt_length": P}, "loss": {"beta": 0.0}})
    runner = UpdateOnly(cfg, random_causal_lm(TINY, dtype, "cpu"), device="cpu")
    result = runner.step(synthetic_rollout(1, 4, P, T, vocab=TINY.vocab))
    assert result.loss == result.loss and len(hooks) == 2  # finite, two micro-batches
    plan = plan_memory(TINY, RunSpec(
        device="cuda", param_dtype_bytes=dtype.itemsize, num_generations=4, prompts_per_step=1,
        micro_batch_rows=m, max_prompt_length=P, max_completion_length=T, gradient_checkpointing=True,
        offload_activations=True, beta=0.0, tiled_mlp="off"))
    line = plan.bytes_of("offloaded checkpoints")
    assert hooks[0].offloaded_bytes == hooks[1].offloaded_bytes == line
    assert pool.peak_bytes_held == pool.bytes_held == line  # the second micro-batch reused the first's buffers
    assert plan.host_bytes == line


def test_bytes_pinned_in_place_reach_the_pinned_host_metric(monkeypatch):
    """``memory/pinned_host_peak_mib`` read only the caching host allocator, which no longer holds the pool's or
    the streamed reference's bytes: what ``register_host`` pinned is added (the driver faked here)."""
    from slimgrpo.output import metrics
    from slimgrpo.memory import pinned

    class FakeCudart:
        def cudaHostRegister(self, ptr, size, flags):
            return 0

        def cudaHostUnregister(self, ptr):
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart())
    monkeypatch.setattr(pinned, "_registered", {"current": 0, "peak": 0})
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.peak": 2**20})
    pool = PinnedPool()  # the real register_host / unregister_host
    held = [pool.acquire((3 * 2**18,), torch.float32)[1] for _ in range(2)]  # 2 x 3 MiB
    assert pinned.registered_bytes() == (6 * 2**20, 6 * 2**20)
    del held
    pool.trim()
    assert pinned.registered_bytes() == (0, 6 * 2**20)
    assert metrics.memory_metrics(torch.device("cuda", 0))["memory/pinned_host_peak_mib"] == 1 + 6


def test_trainer_caps_the_pool_at_the_plans_host_line():
    """The admission takes the plan's "offloaded checkpoints" bytes as the pool's cap, and the run's build hands it
    to the pool (an AST check of the build: the trainer cannot start on CUDA here)."""
    from slimgrpo.config import from_dict, merge_overrides
    from slimgrpo.plan.admission import admission_of
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.runspec.run import run_spec

    cfg = from_dict(merge_overrides({}, ["run.device=cuda", "model.dtype=bfloat16", "lora.enabled=true",
                                         "memory.gradient_checkpointing=true", "memory.offload_activations=true"]))
    plan = plan_memory(TINY, run_spec(cfg, "cuda", vocab=TINY.vocab))
    admission = admission_of(cfg, plan)
    assert admission.offload_cap_bytes == plan.bytes_of("offloaded checkpoints") > 0
    src = (SRC / "train" / "build.py").read_text()
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "set_activation_cap"]
    assert len(calls) == 1
    assert "admission.offload_cap_bytes" in ast.get_source_segment(src, calls[0])


def test_peaks_start_anew_for_the_next_measured_row(monkeypatch):
    """A benchmark measures rows one after another in one process: the pool's peak and the bytes-pinned-in-place
    peak restart at what is held now (not zero: what is still held counts), and a host buffer pinned for the
    streamed reference is unpinned before its memory is freed (the driver faked here)."""
    class FakeCudart:
        def __init__(self):
            self.registered: list[int] = []

        def cudaHostRegister(self, ptr, size, flags):
            self.registered.append(ptr)
            return 0

        def cudaHostUnregister(self, ptr):
            self.registered.remove(ptr)
            return 0

    driver = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: driver)
    monkeypatch.setattr(pinned, "_registered", {"current": 0, "peak": 0})
    monkeypatch.setattr(pinned, "_POOLS", {})
    pool = pinned.activation_pool(torch.device("cuda", 0))
    first = [pool.acquire((2**18,), torch.float32)[1] for _ in range(3)]  # row 1: 3 MiB at once
    del first[1:]  # 1 MiB stays held into row 2
    pool.trim()
    assert pool.peak_bytes_held == 3 * 2**20 and pinned.registered_bytes() == (2**20, 3 * 2**20)
    pinned.reset_pinned_peaks()
    assert pool.peak_bytes_held == 2**20 and pinned.registered_bytes() == (2**20, 2**20)
    second = pool.acquire((2**17,), torch.float32)[1]  # row 2: 0.5 MiB more
    assert pool.peak_bytes_held == 2**20 + 2**19 and pinned.registered_bytes()[1] == 2**20 + 2**19
    del first, second
    pool.trim()

    host = pinned.HostBuffer(page_aligned_empty(5 * PAGE))
    host.pin_once()
    assert host.pinned and host.tensor.data_ptr() in driver.registered
    host.unpin()
    assert not host.pinned and driver.registered == [] and pinned.registered_bytes()[0] == 0
    host.unpin()  # a second call is a no-op
