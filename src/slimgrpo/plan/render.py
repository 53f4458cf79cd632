"""The plan for people: the table of lines (``render_plan``), the memory tricks it assumed and what decided each
(``assumed_tricks``), the trace beside it (``render_trace``), and the warning when a CUDA plan leaves less room
than the allocator's margin (``headroom_warning``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from slimgrpo.forward.costs import shared_prompt_groups, shared_prompt_lighter_without_grad
from slimgrpo.plan.model import TILED_MLP_AUTO_TOKENS, TILED_MLP_MIN_GAIN, decode_packing, plan_memory, tiled_mlp_on
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.runspec.cost import PHASES, num
from slimgrpo.trace.step import CUDA_TRACE_MARGIN, TraceResult
from slimgrpo.units import format_gib, human_count, parse_bytes


def headroom_warning(plan: MemoryPlan, budget: int) -> str | None:
    """On CUDA, a plan that fits ``budget`` with less to spare than the allocator margin
    (``CUDA_TRACE_MARGIN`` of the tensor peak, which the plan does not add and the trace does): say so."""
    if plan.inputs.device != "cuda" or plan.peak_bytes > budget:
        return None
    margin = CUDA_TRACE_MARGIN * plan.tensor_peak_bytes
    spare = budget - plan.peak_bytes
    if spare >= margin:
        return None
    return (f"{format_gib(spare)} GiB to spare is less than the CUDA caching allocator's margin the trace assumes "
            f"({CUDA_TRACE_MARGIN:.0%} of the {format_gib(plan.tensor_peak_bytes)} GiB tensor peak = "
            f"{format_gib(margin)} GiB): the run may not fit; check with `slimgrpo plan --trace` or leave more room")


def render_plan(plan: MemoryPlan, console: Any = None, budget_bytes: int | str | None = None) -> None:
    """Print the plan as a rich table: component, phase, GiB, formula; phase totals; peak; verdict."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    x = plan.inputs
    mode = "QLoRA" if x.load_in_4bit else "LoRA" if x.lora else "full fine-tuning"
    table = Table(title=f"Memory plan: {plan.shape.family} {human_count(plan.shape.num_params)} params, "
                        f"{mode}, {x.device}, rows {x.rows} × (P {x.max_prompt_length} + T {x.max_completion_length})")
    table.add_column("component")
    table.add_column("phase")
    table.add_column("GiB", justify="right")
    table.add_column("formula", overflow="fold")
    for c in plan.components:
        phase = c.phase + (" (host)" if c.location == "host" else "")
        style = "dim" if c.bytes == 0 or c.location == "host" else None
        table.add_row(Text(c.name), phase, format_gib(c.bytes), Text(c.formula), style=style)
    table.add_section()
    for phase in PHASES:
        table.add_row(f"total {phase}", phase, format_gib(plan.phase_total(phase)), "", style="bold")
    table.add_row("peak", plan.peak_phase, format_gib(plan.peak_bytes), f"always + {plan.peak_phase}", style="bold")
    console.print(table)
    if plan.host_bytes:
        console.print(f"host RAM held besides the device peak: {format_gib(plan.host_bytes)} GiB")
    for note in plan.notes:
        console.print(Text("note: ", style="yellow") + Text(note))
    console.print("memory tricks this plan assumes (and what decided each):")
    for line in assumed_tricks(plan):
        console.print(Text("  - " + line), soft_wrap=True)
    if budget_bytes is not None:
        budget = parse_bytes(budget_bytes)
        if plan.peak_bytes <= budget:
            console.print(f"[green]fits[/green] in {format_gib(budget)} GiB "
                          f"({format_gib(budget - plan.peak_bytes)} GiB to spare)")
            warning = headroom_warning(plan, budget)
            if warning:
                console.print(Text("warning: ", style="yellow") + Text(warning), soft_wrap=True)
        else:
            console.print(f"[red]does not fit[/red] in {format_gib(budget)} GiB: "
                          f"over by {format_gib(plan.peak_bytes - budget)} GiB")


def assumed_tricks(plan: MemoryPlan) -> list[str]:
    """One line per memory trick: its state in this plan and the rule or key that set it."""
    shape, x = plan.shape, plan.inputs
    out = [f"gradient checkpointing: {_on(x.gradient_checkpointing)} (memory.gradient_checkpointing)"]
    if x.device == "cuda":
        out.append(f"activation offload to host RAM: {_on(x.offload_activations)} (memory.offload_activations"
                   + (", needs checkpointing)" if x.offload_activations or not x.gradient_checkpointing else ")"))
    tiled = tiled_mlp_on(shape, x)
    if x.tiled_mlp == "auto":
        tokens = x.micro_rows * x.seq_len
        if tokens < TILED_MLP_AUTO_TOKENS:
            why = f"{num(tokens)} tokens per MLP call, under {num(TILED_MLP_AUTO_TOKENS)}"
        else:
            off = plan_memory(shape, dataclasses.replace(x, tiled_mlp="off")).peak_bytes
            on = plan_memory(shape, dataclasses.replace(x, tiled_mlp="on")).peak_bytes
            why = (f"{num(tokens)} tokens per MLP call, at least {num(TILED_MLP_AUTO_TOKENS)}; tiled the plan's peak is "
                   f"{(off - on) / max(off, 1):.0%} lower, {'at least' if tiled else 'under'} {TILED_MLP_MIN_GAIN:.0%}")
        out.append(f"tiled MLP: {_on(tiled)} (memory.tiled_mlp=auto: {why})")
    else:
        out.append(f"tiled MLP: {_on(tiled)} (memory.tiled_mlp={x.tiled_mlp})")
    groups = shared_prompt_groups(x, shape)
    if not x.share_prompt_forward:
        layout = "unpadded rows (memory.share_prompt_forward=false)"
    elif groups:
        layout = (f"each group's prompt once, {groups} group(s) per micro-batch (memory.share_prompt_forward: it keeps "
                  "fewer bytes than unpadded rows)")
    elif x.gradient_checkpointing:
        layout = "unpadded rows (memory.share_prompt_forward needs checkpointing off)"
    else:
        layout = ("unpadded rows (memory.share_prompt_forward: sharing would keep more, or no two rows of a micro-batch "
                  "share a prompt)")
    out.append(f"update layout: {layout}; packed rows (short real lengths) are not planned: an upper bound")
    if x.needs_reference or x.num_iterations > 1 or x.ppo:
        g = max(1, -(-x.micro_rows // max(x.num_generations, 1)))
        shared = x.share_prompt_forward and shared_prompt_lighter_without_grad(shape, x, g)
        out.append(f"reference / old log-prob passes: {'prompt once per group' if shared else 'unpadded rows'} "
                   "(no gradient: shared only where it holds no more than unpadded rows)")
    out.append(f"micro-batches: {x.micro_rows} of {x.rows} rows (memory.micro_batch_size"
               + (", memory.micro_batch_tokens)" if x.micro_batch_tokens else ")"))
    out.append(f"loss: chunked LM head, {num(x.token_chunk)} tokens x {num(x.vocab_chunk or shape.vocab)} vocabulary "
               "per chunk (loss.token_chunk, auto from the vocabulary; loss.vocab_chunk)")
    out.append(f"optimizer: {'8-bit AdamW' if x.optimizer == 'adamw_8bit' else 'AdamW'} (memory.optimizer)")
    if x.rollout_engine == "vllm":
        sleep = ", sleep mode between rollouts" if x.device == "cuda" and x.vllm_sleep else ""
        out.append(f"rollout engine: vLLM, colocated{sleep} (rollout.engine; rollout/costs.py)")
    elif x.device == "cpu":
        packing = decode_packing(shape, x)
        rule = "auto: " if x.decode_packing == "auto" else ""
        out.append(f"decode weights packed: {packing} ({rule}rollout packing rule, plan.model.decode_packing)")
    if x.kv_cache_dtype != "auto":
        out.append(f"KV cache: {x.kv_cache_dtype} (rollout.kv_cache_dtype)")
    return out


def _on(flag: bool) -> str:
    return "on" if flag else "off"


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
