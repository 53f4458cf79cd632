"""The longest context that fits a budget: ``slimgrpo plan CONFIG --budget 80GiB --longest``.

Two shapes of a long sequence, as long-context RL has them:

* **prompt-heavy**: a long prompt (documents, tool transcripts) and the config's completion length;
* **completion-heavy**: the config's prompt length and a long completion (long reasoning).

For each, a binary search over the long part's length, up to the model's position limit after rope scaling
(``ModelShape.max_positions``, ``config/context.py``) less the other part. At every length it tries, the
memory tricks are applied as ``memory.fit`` applies them: ``advice.fit_to_budget`` with the ladder that
keeps the task (``LADDER_SAME_TASK``: every rung but shorter completions), so a length "fits" when the plan
fits the budget with some of the fit's changes, and the answer names those changes. Pure: plans only (a
search of ~17 fits takes well under a second); ``memory/cli.py`` confirms the answer by trace.

    found = longest_context(shape, inputs, budget, "completion-heavy", host_budget=None)
    found.prompt, found.completion, found.changes, found.plan, found.at_limit

The other way round, ``smallest_budget``: the least device budget at which a length (by default the whole
window) fits with those changes (``python -m benchmarks.planner.trace_anchors --only smallest`` confirms it by trace).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from slimgrpo.plan.model import plan_memory
from slimgrpo.plan.search import LADDER_SAME_TASK, fit_to_budget
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape

KINDS = ("prompt-heavy", "completion-heavy")
# Searched up to this many tokens when the model names no position limit.
UNKNOWN_LIMIT_TOKENS = 1 << 20


@dataclass(frozen=True)
class Longest:
    """The answer for one shape: the longest prompt + completion whose fitted plan fits the budget."""

    kind: str  # "prompt-heavy" | "completion-heavy"
    prompt: int  # tokens at the answer (the long part, or the config's when it is the short part)
    completion: int
    fits: bool  # False: not even one token of the long part fits (then prompt / completion are the shortest tried)
    changes: dict[str, Any] = field(default_factory=dict)  # RunSpec fields the fit changed at the answer
    plan: MemoryPlan | None = None  # the fitted plan at the answer
    limit: int = 0  # the most prompt + completion tokens the model takes (0: unknown, searched to UNKNOWN_LIMIT)
    at_limit: bool = False  # the whole window fits: the answer is the position limit, not the budget

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion

    @property
    def long_part(self) -> int:
        return self.prompt if self.kind == "prompt-heavy" else self.completion


def with_length(inputs: RunSpec, kind: str, length: int) -> RunSpec:
    """``inputs`` with the long part of ``kind`` set to ``length`` tokens."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    field_name = "max_prompt_length" if kind == "prompt-heavy" else "max_completion_length"
    return dataclasses.replace(inputs, **{field_name: length})


def fitted(shape: ModelShape, inputs: RunSpec, budget: int,
           host_budget: int | None = None) -> tuple[bool, dict[str, Any], MemoryPlan]:
    """(fits, the fit's changes, the fitted plan): ``memory.fit``'s ladder without shorter completions."""
    final, steps, fits = fit_to_budget(shape, inputs, budget, host_budget, LADDER_SAME_TASK)
    changes: dict[str, Any] = {}
    for step in steps:
        changes.update(step.change)
    plan = steps[-1].plan_after if steps else plan_memory(shape, inputs)
    return fits, changes, plan


def longest_context(shape: ModelShape, inputs: RunSpec, budget: int, kind: str,
                    host_budget: int | None = None) -> Longest:
    """The longest ``kind`` sequence whose plan, fitted as ``memory.fit`` fits it, is within ``budget``.

    The long part runs from 1 token to the position limit less the other part (the config's completion
    length for prompt-heavy, its prompt length for completion-heavy); the fitted peak grows with the length,
    so a binary search finds the last length that fits, to the token."""
    other = inputs.max_completion_length if kind == "prompt-heavy" else inputs.max_prompt_length
    limit = shape.max_positions or 0
    top = (limit or UNKNOWN_LIMIT_TOKENS) - other
    if top < 1:
        raise ValueError(f"the {'completion' if kind == 'prompt-heavy' else 'prompt'} length ({other:,}) leaves no "
                         f"room under the model's position limit ({limit:,})")

    def attempt(length: int):
        return fitted(shape, with_length(inputs, kind, length), budget, host_budget)

    def answer(length: int, result, fits: bool, at_limit: bool = False) -> Longest:
        x = with_length(inputs, kind, length)
        return Longest(kind, x.max_prompt_length, x.max_completion_length, fits, result[1], result[2], limit,
                       at_limit)

    best = attempt(top)
    if best[0]:
        return answer(top, best, True, at_limit=True)
    low = attempt(1)
    if not low[0]:
        return answer(1, low, False)
    lo, hi, lo_result = 1, top, low  # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = attempt(mid)
        if result[0]:
            lo, lo_result = mid, result
        else:
            hi = mid
    return answer(lo, lo_result, True)


@dataclass(frozen=True)
class SmallestBudget:
    """The answer of :func:`smallest_budget`: the least device budget that trains ``tokens`` as ``kind``."""

    budget: int  # device bytes: the fitted plan's tensors x (1 + margin) + its overhead, rounded up to `step`
    found: Longest  # the longest-context answer at that budget: the whole requested length, its changes and plan


def smallest_budget(shape: ModelShape, inputs: RunSpec, kind: str, length: int | None = None,
                    host_budget: int | None = None, margin: float = 0.0, step: int = 1 << 26) -> SmallestBudget:
    """The smallest device budget (a multiple of ``step`` bytes, 64 MiB by default) at which the ``kind``
    sequence with its long part at ``length`` tokens (default: the model's whole window less the short part)
    fits, with ``memory.fit``'s changes as :func:`longest_context` applies them (``LADDER_SAME_TASK``, within
    ``host_budget``). ``margin``: the share of the plan's tensor peak the budget must also leave free (on
    CUDA the trace's allocator margin, ``CUDA_TRACE_MARGIN``), as ``slimgrpo plan --longest`` leaves it; the
    budget is then ``(plan peak - overhead) x (1 + margin) + overhead``.

    The fitted peak never grows with the budget (the ladder is the same rungs in the same order at every
    budget and stops at the first that fits), so a binary search over the budget finds the least one. Raises
    ValueError when ``length`` is past the position limit or nothing fits even without a device limit (the
    host budget too small for the offload the fit needs)."""
    other = inputs.max_completion_length if kind == "prompt-heavy" else inputs.max_prompt_length
    limit = shape.max_positions or 0
    if length is None:
        if not limit:
            raise ValueError("the model names no position limit: give the length to search a budget for")
        length = limit - other
    if limit and length + other > limit:
        raise ValueError(f"{length:,} + {other:,} tokens are past the model's position limit ({limit:,})")
    x = with_length(inputs, kind, length)
    overhead = plan_memory(shape, x).framework_bytes

    def device(target: int) -> int:  # the budget whose margin-free part is `target` (longest_command's inverse)
        return int((target - overhead) * (1 + margin)) + overhead

    def fits(budget: int) -> bool:
        target = int((budget - overhead) / (1 + margin)) + overhead if budget > overhead else budget
        return fitted(shape, x, target, host_budget)[0]

    hi = -(-device(plan_memory(shape, x).peak_bytes) // step) * step  # the config as given fits here
    if not fits(hi):
        raise ValueError(f"{kind} with {length:,} tokens fits no device budget within the host budget "
                         f"({host_budget:,} B): the offload it needs does not fit host RAM")
    lo = 0  # does not fit (every plan holds some weights)
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    target = int((hi - overhead) / (1 + margin)) + overhead
    found = longest_context(shape, inputs, target, kind, host_budget)
    return SmallestBudget(hi, found)
