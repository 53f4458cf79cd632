"""The search for settings that fit a memory budget.

    spec, steps, fits = fit_to_budget(shape, spec, parse_bytes("24GiB"))

The fitting is greedy and cheapest-first. The ladder below orders the knobs by what they cost
in speed or in training quality (free first, changing the task last). At every step the first rung
that lowers the peak by a useful amount (MIN_GAIN_FRACTION of the excess) is applied; the search restarts from the top until the plan fits or no
rung helps. Halving rungs (token_chunk, micro_batch_rows, ...) can be applied several times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slimgrpo.plan.model import plan_memory
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.units import format_gib, parse_bytes


# A rung is applied only if it removes at least this fraction of the excess over the budget, so
# that the sequence is not padded with changes that barely matter.
MIN_GAIN_FRACTION = 0.02
# Floors of the halving rungs: below these the cost outweighs the saving.
MIN_TOKEN_CHUNK = 128
VOCAB_CHUNK = 32_768
MIN_COMPLETION_LENGTH = 64


@dataclass(frozen=True)
class Suggestion:
    """One change of the fitting sequence and the plan once it (and all before it) is applied."""

    change: dict[str, Any]  # RunSpec field -> new value
    description: str  # what it does and what it costs
    plan_after: MemoryPlan


# A rung looks at the current inputs and returns (change, description), or None when it does not apply.
Rung = Callable[[RunSpec], "tuple[dict[str, Any], str] | None"]


def _chunked_loss(x: RunSpec):
    if not x.chunked_loss:
        return {"chunked_loss": True}, "chunked LM-head loss: never materialise [rows, T, V] logits (no quality cost)"
    return None


def _smaller_token_chunk(x: RunSpec):
    if x.chunked_loss and x.token_chunk > MIN_TOKEN_CHUNK:
        new = max(MIN_TOKEN_CHUNK, x.token_chunk // 2)
        return {"token_chunk": new}, f"token_chunk {x.token_chunk} -> {new}: smaller logits chunks (slightly slower)"
    return None


def _vocab_chunk(x: RunSpec):
    if x.chunked_loss and x.vocab_chunk is None:
        return {"vocab_chunk": VOCAB_CHUNK}, f"vocab_chunk {VOCAB_CHUNK}: online log-sum-exp over vocabulary slices"
    return None


def _checkpointing(x: RunSpec):
    if not x.gradient_checkpointing:
        return ({"gradient_checkpointing": True},
                "gradient checkpointing: keep layer inputs only, recompute in backward (~30% slower update)")
    return None


def _eight_bit(x: RunSpec):
    """Not for bfloat16 full fine-tuning sharded by FSDP2: validation refuses that combination
    (config/precision.py: no 8-bit AdamW steps bfloat16 DTensors), so the fit must not land on it."""
    if x.fsdp_shards > 1 and not x.lora and x.param_dtype_bytes == 2:
        return None
    if x.optimizer != "adamw_8bit":
        return {"optimizer": "adamw_8bit"}, "8-bit AdamW: ~2 B per trained parameter instead of 2 moments"
    return None


def _lora(x: RunSpec):
    if not x.lora:
        return ({"lora": True},
                f"LoRA rank {x.lora_rank}: train adapters only; the reference becomes the base (quality may differ)")
    return None


def _offload(x: RunSpec):
    if x.device == "cuda" and x.gradient_checkpointing and not x.offload_activations:
        return ({"offload_activations": True},
                "offload activation checkpoints to host RAM (needs host memory, a few % slower)")
    return None


def _halve(field: str, floor: int, what: str) -> Rung:
    def rung(x: RunSpec):
        current = getattr(x, field)
        if current is None:  # generation_batch_rows: None means all rows
            current = x.rows
        if current > floor:
            new = max(floor, current // 2)
            return {field: new}, f"{field} {current} -> {new}: {what}"
        return None

    rung.__name__ = f"halve_{field}"
    return rung


def _halve_token_budget(x: RunSpec):
    """With memory.micro_batch_tokens set, halve the budget (not below one full row)."""
    if x.micro_batch_tokens is not None and x.micro_rows > 1:
        new = max(x.seq_len, x.micro_batch_tokens // 2)
        return ({"micro_batch_tokens": new},
                f"micro_batch_tokens {x.micro_batch_tokens} -> {new}: more gradient-accumulation passes "
                "(slower update, same result)")
    return None


def _tiled_mlp(x: RunSpec):
    if x.tiled_mlp != "on":
        return ({"tiled_mlp": "on"},
                "tiled MLP: the MLP runs a shard of the tokens at a time, recomputed in backward (one more MLP "
                "forward per layer)")
    return None


def _four_bit(x: RunSpec):
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


def _micro_rows(x: RunSpec) -> RunSpec:
    """Clamp micro_batch_rows to the rows of a step, so halving starts from a real value."""
    if x.micro_batch_rows > x.rows:
        return dataclasses.replace(x, micro_batch_rows=x.rows)
    return x


def suggest_fixes(shape: ModelShape, inputs: RunSpec, budget_bytes: int | str,
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


def _first_rung(shape: ModelShape, ladder, x: RunSpec, plan: MemoryPlan, host_budget: int | None, min_gain: float,
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


def fit_to_budget(shape: ModelShape, inputs: RunSpec, budget_bytes: int | str,
                  host_budget: int | None = None,
                  ladder: tuple[Rung, ...] = LADDER) -> tuple[RunSpec, list[Suggestion], bool]:
    """(inputs with all suggestions applied, the suggestions, whether the final plan fits); ``host_budget``
    and ``ladder`` as in :func:`suggest_fixes`."""
    budget = parse_bytes(budget_bytes)
    steps = suggest_fixes(shape, inputs, budget, host_budget, ladder)
    final = inputs
    for step in steps:
        final = dataclasses.replace(_micro_rows(final), **step.change)
    plan = steps[-1].plan_after if steps else plan_memory(shape, inputs)
    return final, steps, plan.peak_bytes <= budget


def blocked_ways(shape: ModelShape, inputs: RunSpec, budget_bytes: int | str, host_budget: int | None,
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
