"""Fit a run into a memory budget, and show a plan.

    budget = parse_bytes("24GiB")
    inputs, steps, fits = fit_to_budget(shape, inputs, budget)
    render_plan(plan_memory(shape, inputs), budget_bytes=budget)

The fitting is greedy and cheapest-first. The ladder below orders the knobs by what they cost
in speed or in training quality (free first, changing the task last). At every step the first rung
that lowers the peak by a useful amount (MIN_GAIN_FRACTION of the excess) is applied; the search restarts from the top until the plan fits or no
rung helps. Halving rungs (token_chunk, micro_batch_rows, ...) can be applied several times.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slimgrpo.plan.planner import CUDA_TRACE_MARGIN, GiB, PHASES, MemoryPlan, PlanInputs, plan_memory
from slimgrpo.plan.shapes import ModelShape

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}

# A rung is applied only if it removes at least this fraction of the excess over the budget, so
# that the sequence is not padded with changes that barely matter.
MIN_GAIN_FRACTION = 0.02
# Floors of the halving rungs: below these the cost outweighs the saving.
MIN_TOKEN_CHUNK = 128
VOCAB_CHUNK = 32_768
MIN_COMPLETION_LENGTH = 64


def parse_bytes(value: str | int) -> int:
    """Parse a memory size: an int (bytes) or a string such as "16GiB", "16 GB", "1.5TiB", "4096".

    Decimal units (kB, MB, GB, TB = 10^3k) and binary units (KiB, MiB, GiB, TiB = 2^10k) are kept
    apart; case does not matter. A bare "G"/"M"/"K" is ambiguous and rejected.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory size must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a memory size as int or string, got {type(value).__name__}")
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", value)
    if not match:
        raise ValueError(f"cannot read {value!r} as a memory size; write e.g. '16GiB', '24GB' or '8000MiB'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("k", "m", "g", "t"):
        raise ValueError(
            f"{value!r} is ambiguous: write {match.group(1)}{unit.upper()}iB (powers of 1024, what GPU tools "
            f"show) or {match.group(1)}{unit.upper()}B (powers of 1000)"
        )
    if unit == "":
        unit = "b"
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    return int(round(number * _UNITS[unit]))


@dataclass(frozen=True)
class Suggestion:
    """One change of the fitting sequence and the plan once it (and all before it) is applied."""

    change: dict[str, Any]  # PlanInputs field -> new value
    description: str  # what it does and what it costs
    plan_after: MemoryPlan


# A rung looks at the current inputs and returns (change, description), or None when it does not apply.
Rung = Callable[[PlanInputs], "tuple[dict[str, Any], str] | None"]


def _chunked_loss(x: PlanInputs):
    if not x.chunked_loss:
        return {"chunked_loss": True}, "chunked LM-head loss: never materialise [rows, T, V] logits (no quality cost)"
    return None


def _smaller_token_chunk(x: PlanInputs):
    if x.chunked_loss and x.token_chunk > MIN_TOKEN_CHUNK:
        new = max(MIN_TOKEN_CHUNK, x.token_chunk // 2)
        return {"token_chunk": new}, f"token_chunk {x.token_chunk} -> {new}: smaller logits chunks (slightly slower)"
    return None


def _vocab_chunk(x: PlanInputs):
    if x.chunked_loss and x.vocab_chunk is None:
        return {"vocab_chunk": VOCAB_CHUNK}, f"vocab_chunk {VOCAB_CHUNK}: online log-sum-exp over vocabulary slices"
    return None


def _checkpointing(x: PlanInputs):
    if not x.gradient_checkpointing:
        return ({"gradient_checkpointing": True},
                "gradient checkpointing: keep layer inputs only, recompute in backward (~30% slower update)")
    return None


def _eight_bit(x: PlanInputs):
    """Not for bfloat16 full fine-tuning sharded by FSDP2: validation refuses that combination
    (config/precision.py: no 8-bit AdamW steps bfloat16 DTensors), so the fit must not land on it."""
    if x.fsdp_shards > 1 and not x.lora and x.param_dtype_bytes == 2:
        return None
    if x.optimizer != "adamw_8bit":
        return {"optimizer": "adamw_8bit"}, "8-bit AdamW: ~2 B per trained parameter instead of 2 moments"
    return None


def _lora(x: PlanInputs):
    if not x.lora:
        return ({"lora": True},
                f"LoRA rank {x.lora_rank}: train adapters only; the reference becomes the base (quality may differ)")
    return None


def _offload(x: PlanInputs):
    if x.device == "cuda" and x.gradient_checkpointing and not x.offload_activations:
        return ({"offload_activations": True},
                "offload activation checkpoints to host RAM (needs host memory, a few % slower)")
    return None


def _halve(field: str, floor: int, what: str) -> Rung:
    def rung(x: PlanInputs):
        current = getattr(x, field)
        if current is None:  # generation_batch_rows: None means all rows
            current = x.rows
        if current > floor:
            new = max(floor, current // 2)
            return {field: new}, f"{field} {current} -> {new}: {what}"
        return None

    rung.__name__ = f"halve_{field}"
    return rung


def _halve_token_budget(x: PlanInputs):
    """With memory.micro_batch_tokens set, halve the budget (not below one full row)."""
    if x.micro_batch_tokens is not None and x.micro_rows > 1:
        new = max(x.seq_len, x.micro_batch_tokens // 2)
        return ({"micro_batch_tokens": new},
                f"micro_batch_tokens {x.micro_batch_tokens} -> {new}: more gradient-accumulation passes "
                "(slower update, same result)")
    return None


def _tiled_mlp(x: PlanInputs):
    if x.tiled_mlp != "on":
        return ({"tiled_mlp": "on"},
                "tiled MLP: the MLP runs a shard of the tokens at a time, recomputed in backward (one more MLP "
                "forward per layer)")
    return None


def _four_bit(x: PlanInputs):
    if x.device == "cuda" and x.lora and not x.load_in_4bit:
        return {"load_in_4bit": True}, "QLoRA: 4-bit NF4 base weights (slower matmuls, small quality cost)"
    return None


_shorter_completions = _halve("max_completion_length", MIN_COMPLETION_LENGTH, "shorter completions (changes the task)")

LADDER: tuple[Rung, ...] = (
    _chunked_loss,
    _smaller_token_chunk,
    _vocab_chunk,
    _checkpointing,
    _eight_bit,
    _lora,
    _offload,
    _halve_token_budget,
    _halve("micro_batch_rows", 1, "more gradient-accumulation passes (slower update, same result)"),
    _halve("generation_batch_rows", 1, "decode fewer rows at once (slower rollout, same result)"),
    _tiled_mlp,
    _four_bit,
    _shorter_completions,
)
# The ladder without its last rung (shorter completions change the task): what `slimgrpo plan --longest`
# applies at each length it tries (plan/longest.py).
LADDER_SAME_TASK: tuple[Rung, ...] = tuple(r for r in LADDER if r is not _shorter_completions)


def _micro_rows(x: PlanInputs) -> PlanInputs:
    """Clamp micro_batch_rows to the rows of a step, so halving starts from a real value."""
    if x.micro_batch_rows > x.rows:
        return dataclasses.replace(x, micro_batch_rows=x.rows)
    return x


def suggest_fixes(shape: ModelShape, inputs: PlanInputs, budget_bytes: int | str,
                  host_budget: int | None = None, ladder: tuple[Rung, ...] = LADDER) -> list[Suggestion]:
    """Cumulative changes, cheapest first, until the plan's peak is within ``budget_bytes``.

    Empty when the inputs already fit. The last suggestion's ``plan_after`` tells whether the budget
    was reached (``plan_after.peak_bytes <= budget``); see :func:`fit_to_budget`. ``host_budget``: host RAM
    the run may hold off the device (CUDA); a change whose plan needs more (offloading) is not taken.
    ``ladder``: the rungs to try (``LADDER_SAME_TASK`` keeps the completion length).
    """
    budget = parse_bytes(budget_bytes)
    x = inputs
    plan = plan_memory(shape, x)
    steps: list[Suggestion] = []
    same_task = [r for r in ladder if r in LADDER_SAME_TASK]
    while plan.peak_bytes > budget:
        excess = plan.peak_bytes - budget
        # Cheapest first with a useful gain; then any change that keeps the task, however small its gain (an
        # 8-bit optimizer's 0.3 GiB), before the rungs that change the task (shorter completions)
        found = (_first_rung(shape, ladder, x, plan, host_budget, MIN_GAIN_FRACTION * excess, same_task_only=True)
                 or _first_rung(shape, same_task, x, plan, host_budget, 1)
                 or _first_rung(shape, ladder, x, plan, host_budget, MIN_GAIN_FRACTION * excess))
        if found is None:
            break  # no rung lowers the peak any more
        x, plan, step = found
        steps.append(step)
    return steps


def _first_rung(shape: ModelShape, ladder, x: PlanInputs, plan: MemoryPlan, host_budget: int | None, min_gain: float,
                same_task_only: bool = False):
    """``(inputs, plan, Suggestion)`` of the first rung of ``ladder`` that lowers the peak by at least ``min_gain``
    bytes without parking more in host RAM than ``host_budget``; None when none does."""
    for rung in ladder:
        if same_task_only and rung not in LADDER_SAME_TASK:
            continue
        proposal = rung(_micro_rows(x))
        if proposal is None:
            continue
        change, description = proposal
        candidate = dataclasses.replace(_micro_rows(x), **change)
        after = plan_memory(shape, candidate)
        if host_budget is not None and after.host_bytes > max(host_budget, plan.host_bytes):
            continue  # would park more in host RAM than the machine gives the run
        if plan.peak_bytes - after.peak_bytes >= min_gain:
            return candidate, after, Suggestion(change=change, description=description, plan_after=after)
    return None


def fit_to_budget(shape: ModelShape, inputs: PlanInputs, budget_bytes: int | str,
                  host_budget: int | None = None,
                  ladder: tuple[Rung, ...] = LADDER) -> tuple[PlanInputs, list[Suggestion], bool]:
    """(inputs with all suggestions applied, the suggestions, whether the final plan fits); ``host_budget``
    and ``ladder`` as in :func:`suggest_fixes`."""
    budget = parse_bytes(budget_bytes)
    steps = suggest_fixes(shape, inputs, budget, host_budget, ladder)
    final = inputs
    for step in steps:
        final = dataclasses.replace(_micro_rows(final), **step.change)
    plan = steps[-1].plan_after if steps else plan_memory(shape, inputs)
    return final, steps, plan.peak_bytes <= budget


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
def format_gib(n: int) -> str:
    """Bytes as GiB with two decimals ("0.00" for zero)."""
    return f"{n / GiB:,.2f}"


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
    from slimgrpo.units import human_count

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
    from slimgrpo.plan.tricks import assumed_tricks

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


def blocked_ways(shape: ModelShape, inputs: PlanInputs, budget_bytes: int | str, host_budget: int | None,
                 suggestions: list[Suggestion]) -> list[Suggestion]:
    """Ways to fit that the fit did not take because ``host_budget`` is too small: offloading the activation
    checkpoints (CUDA) on top of the suggestions that keep the task, fitted further with the same-task rungs
    as ``memory.fit`` would. Each comes back as one Suggestion (``change``: every change on top of ``inputs``'s
    same-task suggestions; ``plan_after.host_bytes``: the host RAM it needs), to be read as the alternative to
    changing the task. Empty where nothing was blocked."""
    if host_budget is None or inputs.device != "cuda":
        return []
    budget = parse_bytes(budget_bytes)
    x = _micro_rows(inputs)
    for s in suggestions:  # the changes that keep the task, up to the first that does not
        if "max_completion_length" in s.change:
            break
        x = dataclasses.replace(_micro_rows(x), **s.change)
    if x.offload_activations:
        return []
    change = {"gradient_checkpointing": True, "offload_activations": True}
    final, more, _ = fit_to_budget(shape, dataclasses.replace(x, **change), budget, None, LADDER_SAME_TASK)
    plan = more[-1].plan_after if more else plan_memory(shape, final)
    if plan.host_bytes <= host_budget:
        return []
    for step in more:
        change.update(step.change)
    if x.gradient_checkpointing:
        del change["gradient_checkpointing"]
    verdict = "fits" if plan.peak_bytes <= budget else "does not fit"
    return [Suggestion(change=change, plan_after=plan, description=(
        f"offload activation checkpoints to host RAM: {format_gib(plan.peak_bytes)} GiB on the device ({verdict} "
        f"{format_gib(budget)} GiB) with {format_gib(plan.host_bytes)} GiB of host RAM; this machine gives the run "
        f"{format_gib(host_budget)} GiB (memory.host_budget)"))]
