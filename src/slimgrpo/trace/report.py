"""The trace beside the plan: one table of categories (plan lines against trace tags) per phase."""

from __future__ import annotations

from typing import Any

from slimgrpo.plan.advice import format_gib
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.trace.step import CUDA_TRACE_MARGIN, TraceResult

# category -> (plan component names, trace tags). The plan sums each line's own maximum; the trace
# shows what was live at the phase's peak, so single rows may differ where the totals agree.
CATEGORIES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("weights + adapters", ("weights", "LoRA adapters"), ("weights", "LoRA adapters")),
    ("reference copy", ("reference policy",), ("reference policy",)),
    ("optimizer state", ("optimizer state", "fp32 master weights"), ("optimizer state",)),  # the master is state
    ("rollout / log-prob buffers", ("rollout buffers", "log-prob buffers"), ("buffers",)),
    ("KV cache, prefill, sampling", ("KV cache", "generation logits", "prefill working set", "decode weights"),
     ("generation",)),
    ("activations (forward)", ("activations", "attention mask"), ("activations",)),
    ("loss working set", ("loss working set",), ("loss working set",)),
    ("backward (act. grads, recompute)", ("recompute working set", "backward workspace", "tiled MLP shard"),
     ("backward",)),
    ("gradients", ("gradients", "gradient accumulation"), ("gradients",)),
    ("optimizer step", ("optimizer step workspace",), ("optimizer step",)),
    ("other", (), ("update other", "other")),
]
CANNOT_SEE = ("allocator caching and fragmentation, library workspaces (cuBLAS / cuDNN / oneDNN packed "
              "weights), kernels that allocate outside PyTorch tensors, the CUDA context, and the "
              "Python / torch runtime of the process")


def plan_tensor_bytes(plan: MemoryPlan, phase: str) -> int:
    """Device tensor bytes of ``always + phase`` (framework overhead left out)."""
    return plan.phase_total("always") + plan.phase_total(phase) - plan.framework_bytes


def category_rows(plan: MemoryPlan, trace: TraceResult) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """``(category, {phase: (plan bytes, trace bytes)})`` for every category non-zero somewhere."""
    rows = []
    for name, lines, tags in CATEGORIES:
        cells = {}
        for phase, peak in trace.phases.items():
            planned = sum(c.bytes for c in plan.components if c.name in lines and c.location == "device"
                          and c.phase in ("always", phase))
            cells[phase] = (planned, sum(peak.by_tag.get(t, 0) for t in tags))
        if any(a or b for a, b in cells.values()):
            rows.append((name, cells))
    return rows


def render_trace(plan: MemoryPlan, trace: TraceResult, console: Any = None,
                 budget_bytes: int | None = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    phases = list(trace.phases)
    table = Table(title=f"Trace: one step on fake tensors at full size ({trace.seconds:.1f} s), "
                        "live tensor GiB at each phase's peak, beside the plan")
    table.add_column("category")
    for phase in phases:
        table.add_column(f"plan {phase}", justify="right")
        table.add_column(f"trace {phase}", justify="right")
    for name, cells in category_rows(plan, trace):
        table.add_row(name, *[v for p in phases for v in map(format_gib, cells[p])])
    table.add_section()
    table.add_row("tensor peak", *[v for p in phases
                                   for v in (format_gib(plan_tensor_bytes(plan, p)),
                                             format_gib(trace.phases[p].peak_bytes))], style="bold")
    console.print(table)
    planned = plan.tensor_peak_bytes
    console.print(f"tensor peak: plan {format_gib(planned)} GiB ({plan.peak_phase}), trace "
                  f"{format_gib(trace.peak_bytes)} GiB ({trace.peak_phase}); trace / plan = "
                  f"{trace.peak_bytes / max(planned, 1):.2f}", soft_wrap=True)
    extra = (f"CUDA context {format_gib(trace.overhead_bytes)} GiB + allocator margin "
             f"{CUDA_TRACE_MARGIN:.0%} of the traced peak ({format_gib(trace.margin_bytes)} GiB)"
             if trace.device == "cuda" else f"process runtime and tokenizer {format_gib(trace.overhead_bytes)} GiB (measured)")
    console.print(f"device peak from the trace: {format_gib(trace.device_peak_bytes)} GiB = traced "
                  f"{format_gib(trace.peak_bytes)} + {extra}; plan {format_gib(plan.peak_bytes)} GiB", soft_wrap=True)
    if trace.device == "cuda" and (trace.host_peak_bytes or plan.host_bytes):
        console.print(f"host memory, apart from the device peak: trace {format_gib(trace.host_peak_bytes)} GiB at "
                      f"most (offloaded checkpoints, reference copy), plan {format_gib(plan.host_bytes)} GiB",
                      soft_wrap=True)
    if trace.kv_bytes:
        console.print(f"generation tensors live at the last traced decode step (KV cache, output buffers): "
                      f"{format_gib(trace.kv_bytes)} GiB", soft_wrap=True)
    console.print(Text("the trace cannot see: ", style="yellow") + Text(CANNOT_SEE), soft_wrap=True)
    for note in trace.notes:
        console.print(Text("note: ", style="yellow") + Text(note), soft_wrap=True)
    if budget_bytes is not None:
        verdict = "fits" if trace.device_peak_bytes <= budget_bytes else "does not fit"
        console.print(f"by the trace the run {verdict} in {format_gib(budget_bytes)} GiB", soft_wrap=True)
