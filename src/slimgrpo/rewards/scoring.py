"""Calling reward functions safely and combining their scores into one reward per completion.

``RewardRunner.score`` calls every function once for the whole batch (TRL's contract), checks what
came back, and returns a ``RewardOutput``:

* ``per_function[r, f]``: the value of function ``f`` for row ``r``; NaN where it returned ``None``
  ("not applicable") or where a fault was skipped;
* ``total[r] = nansum_f(weights[f] * per_function[r, f])``: NaN entries are left out. A row where
  every function is NaN has no reward at all: its total stays NaN (unscorable: left out of the reward
  statistics and the baselines, advantage 0, as in TRL 1.16; what is shown or logged per row turns it
  into a number there) and it is counted as ``fault_counts["total/all_nan"]``.

Faults, counted per affected row as ``fault_counts["<name>/<fault>"]``:

* ``exception``: the call raised (all rows);
* ``timeout``: the call took longer than ``timeout_s`` (all rows);
* ``wrong_length``: it returned something other than a list of one value per row (all rows);
* ``not_a_number``: a value is neither a number nor ``None`` (that row);
* ``non_finite``: a value is NaN or infinite (that row).

``on_error`` says what happens then: ``"raise"`` raises ``RewardFunctionError`` naming the function,
the fault, the first offending sample with its prompt and completion; ``"zero"`` scores the offending
rows 0.0; ``"skip"`` leaves them NaN (so they drop out of the weighted sum).

* ``non_finite`` also covers values too large for float32 (e.g. ``1e40``), which would become inf.

A reward function cannot end the run: ``SystemExit`` (``sys.exit``), ``KeyboardInterrupt`` and any
other ``BaseException`` it raises is an ``exception`` fault, and so is ``os._exit`` called from the
reward thread (a guard replaces ``os._exit`` for the reward worker threads only, so the call raises in
the function instead of killing the process). Code that ends the process at C level (``exit()`` in an
extension) is only contained by ``isolation="process"``, where a child that dies without an answer is
an ``exception`` fault. Every function gets its own copy of the inputs: in-place edits by one never
reach the next. A real Ctrl-C reaches the main thread, not the reward thread, and stops the run as usual.
Because calls run in a worker thread, code that needs the main thread (``signal.alarm`` timeouts,
``signal.signal``) must use ``isolation="process"``, where the forked child runs it in its main thread.

Timeouts work from any thread (no ``signal.alarm``). With ``isolation="thread"`` (default) every call
runs in a daemon worker thread; a call still running after ``HEARTBEAT_S`` seconds logs a line every
``HEARTBEAT_S`` seconds; a call that overruns ``timeout_s`` is abandoned, **but a hung Python function
keeps running in its daemon thread** until it returns by itself (Python cannot kill a thread). With
``isolation="process"`` every call runs in a child process which is killed on timeout; the
function's return value must then be picklable, side effects on globals are lost, and the child
shares nothing with the parent after it starts (POSIX only). The child is forked while the process has
not touched CUDA and spawned once it has (``process_call.py``: a forked CUDA process is unsafe); a spawned
child gets the function by reference, so it must be defined at the top level of a module or file.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import multiprocessing
import numbers
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from slimgrpo.rewards.answers import completion_text
from slimgrpo.rewards.contract import CONTRACT_KWARGS, RewardLogs, accepted_kwargs, logs_in
from slimgrpo.rewards.process_call import start_child
from slimgrpo.containers import RewardOutput

__all__ = ["RewardRunner", "RewardFunctionError", "FAULT_KINDS"]

FAULT_KINDS = ("exception", "timeout", "wrong_length", "not_a_number", "non_finite")
ON_ERROR_MODES = ("raise", "zero", "skip")
ISOLATION_MODES = ("thread", "process")
_RESERVED = ("prompts", "completions", "completion_ids", *CONTRACT_KWARGS)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
HEARTBEAT_S = 30.0  # a reward call running longer than this logs a line every HEARTBEAT_S seconds
log = logging.getLogger("slimgrpo")


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


class RewardExit(BaseException):
    """Raised in a reward worker thread in place of ``os._exit(code)``."""


_REWARD_THREADS: set[int] = set()
_REAL_EXIT = os._exit


def _guarded_exit(code: int = 0) -> None:
    if threading.get_ident() in _REWARD_THREADS:
        raise RewardExit(f"the reward function called os._exit({code}), which would end the training process")
    _REAL_EXIT(code)


def _install_exit_guard() -> None:
    """``os._exit`` from a reward worker thread raises there instead of killing the process; from any
    other thread (or a forked child) it is the real one."""
    if os._exit is not _guarded_exit:
        os._exit = _guarded_exit  # type: ignore[assignment]


def _call_in_thread(fn: Callable, kwargs: dict, timeout_s: float | None, name: str = "") -> Any:
    """Run the call in a worker thread, so anything it raises (SystemExit and KeyboardInterrupt too) is
    a fault of the function, and a slow call shows signs of life."""
    _install_exit_guard()
    box: dict[str, Any] = {}

    def target():
        _REWARD_THREADS.add(threading.get_ident())
        try:
            box["value"] = _coerce(_invoke(fn, kwargs))
        except BaseException:
            box["error"] = traceback.format_exc(limit=-3)
        finally:
            _REWARD_THREADS.discard(threading.get_ident())

    label = name or getattr(fn, "__name__", "fn")
    worker = threading.Thread(target=target, daemon=True, name=f"slimgrpo-reward-{label}")
    worker.start()

    def finished(seconds: float | None) -> bool:
        worker.join(seconds)
        return not worker.is_alive()

    _wait_with_heartbeat(finished, timeout_s, label)
    if worker.is_alive():
        raise _Timeout()
    if "error" in box:
        raise _CallFailed(box["error"])
    return box["value"]


def _plain_copy(value: Any) -> Any:
    """Lists, tuples and dicts rebuilt all the way down; anything else (strings, numbers, environment objects
    of a multi-turn rollout) is shared, so objects that cannot or must not be copied stay themselves."""
    if isinstance(value, dict):
        return {k: _plain_copy(v) for k, v in value.items()}
    if type(value) in (list, tuple):  # exact types: a namedtuple or list subclass is shared as it is
        return type(value)(_plain_copy(v) for v in value)
    return value


def _copy_inputs(kwargs: dict) -> dict:
    """A private copy of the inputs for one function (token ids copied the fast way). Only plain data
    (lists, tuples, dicts) is copied; callables and other objects passed along are shared."""
    out = {k: _plain_copy(v) for k, v in kwargs.items() if k != "completion_ids"}
    ids = kwargs.get("completion_ids")
    out["completion_ids"] = None if ids is None else [list(row) for row in ids]
    return out


def _child_main(conn, fn: Callable, kwargs: dict) -> None:
    try:
        value = _coerce(_invoke(fn, kwargs))
        logs = logs_in(kwargs)  # log_metric/log_extra calls made in this forked copy go back with the value
        conn.send(("ok", (value, logs.records() if logs else None)))
    except BaseException:
        conn.send(("error", traceback.format_exc(limit=-3)))
    finally:
        conn.close()


def _wait_with_heartbeat(ready: Callable[[float | None], bool], timeout_s: float | None, label: str) -> bool:
    """Wait until ``ready(seconds)`` is true or ``timeout_s`` passes, logging a line every ``HEARTBEAT_S``."""
    t0 = time.monotonic()
    while True:
        waited = time.monotonic() - t0
        left = None if timeout_s is None else timeout_s - waited
        if left is not None and left <= 0:
            return False
        if ready(HEARTBEAT_S if left is None else min(HEARTBEAT_S, left)):
            return True
        waited = time.monotonic() - t0
        if timeout_s is None or waited < timeout_s:
            limit = "no limit" if timeout_s is None else f"rewards.timeout_s={timeout_s:g}"
            log.warning("reward function %r still running after %.0f s (%s)", label, waited, limit)


def _call_in_process(fn: Callable, kwargs: dict, timeout_s: float | None, name: str = "") -> Any:
    try:  # fork, or spawn once CUDA is initialised (rewards/process_call.py)
        child, parent_conn = start_child(_child_main, fn, kwargs)
    except TypeError as e:  # the call cannot travel to a spawned child: a fault of this call, with the reason
        raise _CallFailed(str(e)) from None
    try:
        if not _wait_with_heartbeat(parent_conn.poll, timeout_s, name or getattr(fn, "__name__", "fn")):
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
        max_failed_steps: raise ``RewardFunctionError`` when a function gives no usable value (every
            row a fault or None) in this many consecutive ``score`` calls; each such call logs a warning
            naming it. 0 (default) = never stop (training passes ``rewards.max_failed_steps``).
    """

    def __init__(
        self,
        functions: Sequence[tuple[str, Callable]],
        weights: Sequence[float] | None = None,
        on_error: str = "raise",
        timeout_s: float | None = None,
        isolation: str = "thread",
        max_failed_steps: int = 0,
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
        self.max_failed_steps = int(max_failed_steps)
        self.failed_streak = {name: 0 for name in names}  # consecutive calls with no usable value

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
            before = sum(v for k, v in faults.items() if k.startswith(f"{name}/"))
            fn_kwargs = {**_copy_inputs(kwargs), **{k: contract[k] for k in accepted_kwargs(fn)}}
            values = self._run_one(name, fn, fn_kwargs, rows, faults)
            per_function[:, f] = torch.tensor(values, dtype=torch.float32)
            failed = sum(v for k, v in faults.items() if k.startswith(f"{name}/")) - before
            self._track_failures(name, values, failed, rows, kwargs)
        weights = torch.tensor(self.weights, dtype=torch.float32)
        weighted = per_function * weights
        no_reward = torch.isnan(per_function).all(dim=1)
        if rows and bool(no_reward.any()):
            faults["total/all_nan"] = int(no_reward.sum())
        total = torch.nansum(weighted, dim=1).masked_fill(no_reward, float("nan"))  # unscorable rows stay NaN
        return RewardOutput(per_function=per_function, total=total, names=list(self.names), fault_counts=faults,
                            logged_metrics=logs.metric_sums(), extra_columns=logs.extra_columns())

    def _run_one(self, name: str, fn: Callable, kwargs: dict, rows: int, faults: dict[str, int]) -> list[float]:
        """Call one function and turn its answer into ``rows`` floats (NaN for None/skipped)."""
        try:
            if self.isolation == "process":
                values = _call_in_process(fn, kwargs, self.timeout_s, name)
            else:
                values = _call_in_thread(fn, kwargs, self.timeout_s, name)
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
            elif abs(v) > FLOAT32_MAX:
                fault, detail = "non_finite", f"returned {v}, too large for float32 (at most {FLOAT32_MAX:.3g})"
            if fault is None:
                out.append(v)
                continue
            if self.on_error == "raise":
                raise self._error(name, fault, detail, kwargs, i)
            faults[f"{name}/{fault}"] = faults.get(f"{name}/{fault}", 0) + 1
            out.append(replacement)
        return out

    def _track_failures(self, name: str, values: list[float], failed: int, rows: int, kwargs: dict) -> None:
        """Warn when a function gave no usable value this call; raise after ``max_failed_steps`` in a row."""
        usable = sum(1 for v in values if v == v) - (failed if self.on_error == "zero" else 0)  # NaN: None/skip
        if not rows or usable > 0:
            self.failed_streak[name] = 0
            return
        self.failed_streak[name] += 1
        streak, limit = self.failed_streak[name], self.max_failed_steps
        why = f"all {rows} values were faults (rewards.on_error={self.on_error})" if failed else \
            f"it returned None for all {rows} completions"
        if limit and streak >= limit:
            message = (f"reward function {name!r} gave no usable value for {streak} steps in a row: {why}. "
                       f"Training on it teaches nothing. Fix the function (run it on a few completions by hand), "
                       f"or raise rewards.max_failed_steps (0 = never stop).")
            raise RewardFunctionError(message, function=name, fault="no_usable_value", index=0)
        more = f"; the run stops after {limit} in a row (rewards.max_failed_steps)" if limit else ""
        log.warning("reward function %r gave no usable value this step: %s (%d step%s in a row%s)",
                    name, why, streak, "" if streak == 1 else "s", more)

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
