"""Calling reward functions safely and combining their scores into one reward per completion.

``RewardRunner.score`` calls every function once for the whole batch (TRL's contract), checks what
came back, and returns a ``RewardOutput``:

* ``per_function[r, f]``: the value of function ``f`` for row ``r``; NaN where it returned ``None``
  ("not applicable") or where a fault was skipped;
* ``total[r] = nansum_f(weights[f] * per_function[r, f])``: NaN entries are left out. A row where
  every function is NaN has no reward at all: its total is 0.0 and it is counted as
  ``fault_counts["total/all_nan"]``.

Faults, counted per affected row as ``fault_counts["<name>/<fault>"]``:

* ``exception``: the call raised (all rows);
* ``timeout``: the call took longer than ``timeout_s`` (all rows);
* ``wrong_length``: it returned something other than a list of one value per row (all rows);
* ``not_a_number``: a value is neither a number nor ``None`` (that row);
* ``non_finite``: a value is NaN or infinite (that row).

``on_error`` says what happens then: ``"raise"`` raises ``RewardFunctionError`` naming the function,
the fault, the first offending sample with its prompt and completion; ``"zero"`` scores the offending
rows 0.0; ``"skip"`` leaves them NaN (so they drop out of the weighted sum).

Timeouts work from any thread (no ``signal.alarm``). With ``isolation="thread"`` (default) the call
runs in a daemon worker thread; a call that overruns is abandoned, **but a hung Python function
keeps running in its daemon thread** until it returns by itself (Python cannot kill a thread). With
``isolation="process"`` every call runs in a forked child process which is killed on timeout; the
function's return value must then be picklable, side effects on globals are lost, and the child
shares nothing with the parent after the fork (POSIX only).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import multiprocessing
import numbers
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from slimgrpo.rewards.answers import completion_text
from slimgrpo.rewards.contract import CONTRACT_KWARGS, RewardLogs, accepted_kwargs, logs_in
from slimgrpo.types import RewardOutput

__all__ = ["RewardRunner", "RewardFunctionError", "FAULT_KINDS"]

FAULT_KINDS = ("exception", "timeout", "wrong_length", "not_a_number", "non_finite")
ON_ERROR_MODES = ("raise", "zero", "skip")
ISOLATION_MODES = ("thread", "process")
_RESERVED = ("prompts", "completions", "completion_ids", *CONTRACT_KWARGS)


class RewardFunctionError(RuntimeError):
    """A reward function misbehaved and ``on_error="raise"``.

    Attributes: ``function`` (display name), ``fault`` (one of ``FAULT_KINDS``), ``index`` (first
    offending row), ``traceback_text`` (the function's own traceback for an ``exception`` fault; the
    message carries only its last line and where it was raised; ``slimgrpo --debug`` prints it).
    """

    def __init__(self, message: str, function: str, fault: str, index: int, traceback_text: str | None = None):
        super().__init__(message)
        self.function, self.fault, self.index = function, fault, index
        self.traceback_text = traceback_text


class _Timeout(Exception):
    pass


class _CallFailed(Exception):
    """The function raised (``detail`` holds a short traceback)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def _summarise_traceback(text: str) -> str:
    """``KeyError: 'x' (raised in rewards.py, line 4, in score)`` from a formatted traceback."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("Traceback"):
        return text.strip()
    last = lines[-1].strip()
    frames = [ln.strip() for ln in lines if ln.strip().startswith('File "')]
    if not frames:
        return f"raised {last}"
    where = frames[-1][len("File "):].replace('"', "")
    return f"raised {last} (at {where})"


class _NotANumber:
    """Stands for a returned value that is not a number (``repr`` kept for error messages)."""

    def __init__(self, text: str):
        self.text = text


def _short(value: Any, limit: int = 200) -> str:
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        text = " | ".join(f"{m.get('role', '?')}: {completion_text([m])}" for m in value if isinstance(m, dict))
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _invoke(fn: Callable, kwargs: dict) -> Any:
    """Call ``fn``; await its result if it is a coroutine (async reward functions)."""
    result = fn(**kwargs)
    if inspect.isawaitable(result):

        async def wait():
            return await result

        result = asyncio.run(wait())
    return result


def _coerce(values: Any) -> Any:
    """Turn a returned sequence into a list of float | None | _NotANumber; other returns unchanged."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().tolist() if values.dim() == 1 else values
    elif hasattr(values, "tolist") and getattr(values, "ndim", None) == 1:  # numpy arrays
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        return values
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if v is None:
            out.append(None)
        elif isinstance(v, numbers.Real):
            out.append(float(v))
        else:
            out.append(_NotANumber(repr(v)[:80]))
    return out


def _call_in_thread(fn: Callable, kwargs: dict, timeout_s: float | None) -> Any:
    if timeout_s is None:
        try:
            return _coerce(_invoke(fn, kwargs))
        except Exception:
            raise _CallFailed(traceback.format_exc(limit=-3)) from None
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = _coerce(_invoke(fn, kwargs))
        except BaseException:
            box["error"] = traceback.format_exc(limit=-3)

    worker = threading.Thread(target=target, daemon=True, name=f"slimgrpo-reward-{getattr(fn, '__name__', 'fn')}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _Timeout()
    if "error" in box:
        raise _CallFailed(box["error"])
    return box["value"]


def _child_main(conn, fn: Callable, kwargs: dict) -> None:
    try:
        value = _coerce(_invoke(fn, kwargs))
        logs = logs_in(kwargs)  # log_metric/log_extra calls made in this forked copy go back with the value
        conn.send(("ok", (value, logs.records() if logs else None)))
    except BaseException:
        conn.send(("error", traceback.format_exc(limit=-3)))
    finally:
        conn.close()


def _call_in_process(fn: Callable, kwargs: dict, timeout_s: float | None) -> Any:
    context = multiprocessing.get_context("fork")
    parent_conn, child_conn = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(child_conn, fn, kwargs), daemon=True)
    child.start()
    child_conn.close()
    try:
        if not parent_conn.poll(timeout_s):
            raise _Timeout()
        try:
            status, payload = parent_conn.recv()
        except (EOFError, OSError):
            child.join(1.0)
            raise _CallFailed(f"the reward process died without an answer (exit code {child.exitcode})") from None
    finally:
        parent_conn.close()
        if child.is_alive():
            child.kill()
        child.join()
    if status == "error":
        raise _CallFailed(payload)
    value, records = payload
    logs = logs_in(kwargs)
    if logs is not None and records is not None:
        logs.merge(records)
    return value


class RewardRunner:
    """Scores completions with several reward functions and combines them with weights.

    Args:
        functions: ``[(display_name, fn), ...]`` as returned by ``load_reward_function``.
        weights: one weight per function (TRL's ``reward_weights``); ``None`` gives all 1.0.
        on_error: ``"raise"`` | ``"zero"`` | ``"skip"`` (see the module docs).
        timeout_s: longest a single call may take, in seconds; ``None`` for no limit.
        isolation: ``"thread"`` (default) or ``"process"`` (forked child, killed on timeout).
    """

    def __init__(
        self,
        functions: Sequence[tuple[str, Callable]],
        weights: Sequence[float] | None = None,
        on_error: str = "raise",
        timeout_s: float | None = None,
        isolation: str = "thread",
    ):
        functions = list(functions)
        if not functions:
            raise ValueError("RewardRunner needs at least one reward function")
        for item in functions:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1])):
                raise ValueError(f"RewardRunner: functions must be (name, callable) pairs, got {item!r}")
        names = [name for name, _ in functions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"RewardRunner: reward function names must be distinct (they name the metrics), repeated: {duplicates}"
            )
        if weights is None:
            weights = [1.0] * len(functions)
        weights = [float(w) for w in weights]
        if len(weights) != len(functions):
            raise ValueError(
                f"RewardRunner: got {len(weights)} reward_weights for {len(functions)} reward functions "
                f"({', '.join(names)}); give one weight per function"
            )
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"RewardRunner: reward_weights must be finite numbers, got {weights}")
        if on_error not in ON_ERROR_MODES:
            raise ValueError(f"RewardRunner: on_error must be one of {ON_ERROR_MODES}, got {on_error!r}")
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"RewardRunner: isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        if isolation == "process" and "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("RewardRunner: isolation='process' needs os.fork (Linux/macOS); use 'thread'")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"RewardRunner: timeout_s must be positive or None, got {timeout_s}")
        self.functions = functions
        self.names = names
        self.weights = weights
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.isolation = isolation

    def score(
        self,
        prompts: Sequence,
        completions: Sequence,
        completion_ids: Sequence[Sequence[int]] | None,
        columns: dict[str, Sequence] | None = None,
        trainer_state: Any = None,
    ) -> RewardOutput:
        """Score ``rows = len(completions)`` completions with every function.

        Like TRL, functions also get ``trainer_state`` (as given), ``log_metric`` and ``log_extra`` (see
        ``slimgrpo.rewards.contract``); each only when the function accepts it. What they log comes back
        in ``RewardOutput.logged_metrics`` / ``extra_columns``.

        ``prompts`` and each column may hold one value per row, or one per prompt (``groups`` values,
        with ``rows % groups == 0``): then row ``r`` gets value ``r // (rows // groups)``.
        """
        rows = len(completions)
        prompts = _per_row("prompts", prompts, rows)
        if completion_ids is not None and len(completion_ids) != rows:
            raise ValueError(f"RewardRunner.score: {len(completion_ids)} completion_ids for {rows} completions")
        columns = dict(columns or {})
        clash = [c for c in columns if c in _RESERVED]
        if clash:
            raise ValueError(f"RewardRunner.score: dataset columns {clash} clash with reward arguments; rename them")
        columns = {name: _per_row(f"column {name!r}", values, rows) for name, values in columns.items()}
        kwargs = {
            "prompts": prompts,
            "completions": list(completions),
            "completion_ids": None if completion_ids is None else [list(ids) for ids in completion_ids],
            **columns,
        }
        logs = RewardLogs(rows)
        contract = {"trainer_state": trainer_state, "log_metric": logs.log_metric, "log_extra": logs.log_extra}
        per_function = torch.full((rows, len(self.functions)), float("nan"), dtype=torch.float32)
        faults: dict[str, int] = {}
        for f, (name, fn) in enumerate(self.functions):
            fn_kwargs = {**kwargs, **{k: contract[k] for k in accepted_kwargs(fn)}}
            values = self._run_one(name, fn, fn_kwargs, rows, faults)
            per_function[:, f] = torch.tensor(values, dtype=torch.float32)
        weights = torch.tensor(self.weights, dtype=torch.float32)
        weighted = per_function * weights
        total = torch.nansum(weighted, dim=1)
        no_reward = torch.isnan(per_function).all(dim=1)
        if rows and bool(no_reward.any()):
            faults["total/all_nan"] = int(no_reward.sum())
        total = torch.where(no_reward, torch.zeros_like(total), total)
        return RewardOutput(per_function=per_function, total=total, names=list(self.names), fault_counts=faults,
                            logged_metrics=logs.metric_sums(), extra_columns=logs.extra_columns())

    def _run_one(self, name: str, fn: Callable, kwargs: dict, rows: int, faults: dict[str, int]) -> list[float]:
        """Call one function and turn its answer into ``rows`` floats (NaN for None/skipped)."""
        call = _call_in_process if self.isolation == "process" else _call_in_thread
        try:
            values = call(fn, kwargs, self.timeout_s)
        except _Timeout:
            detail = f"the call took longer than timeout_s={self.timeout_s}"
            return self._whole_call_fault(name, "timeout", detail, kwargs, rows, faults)
        except _CallFailed as failure:
            return self._whole_call_fault(name, "exception", _summarise_traceback(failure.detail), kwargs, rows,
                                          faults, traceback_text=failure.detail)
        if not isinstance(values, list) or len(values) != rows:
            got = f"{len(values)} values" if isinstance(values, list) else f"a {type(values).__name__}"
            detail = f"returned {got}; expected a list of {rows} values (one per completion, None allowed)"
            return self._whole_call_fault(name, "wrong_length", detail, kwargs, rows, faults)
        out: list[float] = []
        replacement = 0.0 if self.on_error == "zero" else float("nan")
        for i, v in enumerate(values):
            if v is None:
                out.append(float("nan"))
                continue
            fault, detail = None, ""
            if isinstance(v, _NotANumber):
                fault, detail = "not_a_number", f"returned {v.text} (expected a float or None)"
            elif not math.isfinite(v):
                fault, detail = "non_finite", f"returned {v} (use None for 'not applicable')"
            if fault is None:
                out.append(v)
                continue
            if self.on_error == "raise":
                raise self._error(name, fault, detail, kwargs, i)
            faults[f"{name}/{fault}"] = faults.get(f"{name}/{fault}", 0) + 1
            out.append(replacement)
        return out

    def _whole_call_fault(self, name, fault, detail, kwargs, rows, faults, traceback_text=None) -> list[float]:
        if self.on_error == "raise":
            raise self._error(name, fault, detail, kwargs, 0, whole_call=True, traceback_text=traceback_text)
        faults[f"{name}/{fault}"] = faults.get(f"{name}/{fault}", 0) + rows
        return [0.0 if self.on_error == "zero" else float("nan")] * rows

    def _error(self, name, fault, detail, kwargs, index, whole_call=False, traceback_text=None) -> RewardFunctionError:
        rows = len(kwargs["completions"])
        where = f"the call on all {rows} samples (first: sample 0)" if whole_call else f"sample {index}"
        prompt = kwargs["prompts"][index] if rows else ""
        completion = kwargs["completions"][index] if rows else ""
        message = (
            f"reward function {name!r} failed ({fault}) on {where}: {detail}\n"
            f"  prompt[{index}]: {_short(prompt)}\n"
            f"  completion[{index}]: {_short(completion)}\n"
            f"{_plain_text_hint(kwargs['completions'], detail)}"
            f"Fix the function, or set rewards.on_error (RewardRunner's on_error) to 'zero' or 'skip' to score "
            f"such rows 0.0 or leave them out."
        )
        return RewardFunctionError(message, function=name, fault=fault, index=index, traceback_text=traceback_text)


_STRING_INDEXING = ("string indices must be integers", "'str' object has no attribute", "KeyError: 'content'")


def _plain_text_hint(completions: Sequence, detail: str) -> str:
    """A hint when a TRL-style function indexes ``completion[0]["content"]`` but completions are strings."""
    if not completions or not isinstance(completions[0], str) or not any(s in detail for s in _STRING_INDEXING):
        return ""
    return (
        "  hint: the prompts are plain text, so each completion is a plain string (TRL does the same); "
        "a function that reads completion[0]['content'] needs conversational prompts: use a prompt column "
        "of [{'role': ..., 'content': ...}] messages, or set data.conversational=true (with data.system_prompt) "
        "to build them from a text column.\n"
    )


def _per_row(what: str, values: Sequence | None, rows: int) -> list:
    """Expand per-prompt values to per-row values (group-major), or check per-row ones."""
    if values is None:
        return [None] * rows
    values = list(values)
    if len(values) == rows:
        return values
    if values and rows % len(values) == 0:
        repeat = rows // len(values)
        return [v for v in values for _ in range(repeat)]
    raise ValueError(
        f"RewardRunner.score: {what} has {len(values)} values for {rows} completions; "
        "give one per completion or one per prompt"
    )
