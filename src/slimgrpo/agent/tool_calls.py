"""Tool calls: find them in an assistant turn, run them, turn the results into tool messages.

Parsing covers the two families of chat templates in use:

* Hermes style (Qwen2.5, Qwen3, many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number per turn, free text around them;
* Llama 3.x JSON: the whole turn is ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``), several calls separated by ``;``.

Running follows TRL 1.16's ``GRPOTrainer`` tool loop: a tool is called as ``fn(**arguments)`` (sync, or
async and awaited); its result becomes ``{"role": "tool", "name": name, "content": str(result)}``; an
exception becomes the content ``str({"error": str(e)})``; an unknown name raises ``Tool <name> not found.``
inside that wrapper. slimgrpo adds what a long training run needs and TRL leaves to the tool: a time limit
per call (``{"error": "Tool <name> timed out after <s> s"}``), a cap on the result's length, and a tool
message for a malformed call (TRL treats a turn whose call does not parse as a plain answer);
and the calls of different rows of one turn run concurrently (``ToolRunner.run_rows``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    """One call found in a turn; ``error`` is set when the call could not be read."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_message_call(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of an assistant message (the chat template's format)."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _one_call(obj: Any, arg_keys: tuple[str, ...]) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall("unknown", error="Malformed tool call: expected a JSON object with a string 'name'")
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error=f"Malformed tool call: arguments of {obj['name']} are not JSON")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error=f"Malformed tool call: arguments of {obj['name']} must be an object")
    return ToolCall(obj["name"], args)


def parse_hermes(text: str) -> list[ToolCall]:
    """``<tool_call>{json}</tool_call>`` blocks (an unclosed last block counts)."""
    calls = []
    for body in _HERMES.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ToolCall("unknown", error=f"Malformed tool call: invalid JSON ({e.msg})"))
            continue
        calls.append(_one_call(obj, ("arguments", "parameters")))
    return calls


def parse_llama3(text: str) -> list[ToolCall]:
    """A turn that is only JSON call objects (Llama 3.x), ``;``-separated; anything else is no call."""
    body = text.replace("<|python_tag|>", "").strip()
    if not body.startswith("{"):
        return []
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            if calls or '"name"' in body:
                calls.append(ToolCall("unknown", error=f"Malformed tool call: invalid JSON ({e.msg})"))
            break
        if not (isinstance(obj, dict) and "name" in obj):
            return calls  # plain JSON answer, not a call
        calls.append(_one_call(obj, ("parameters", "arguments")))
        pos = end
        while pos < len(body) and body[pos] in "; \n\t":
            pos += 1
    return calls


def parse_tool_calls(text: str, fmt: str = "auto") -> list[ToolCall]:
    """Tool calls in an assistant turn's text. ``fmt``: ``hermes``, ``llama3`` or ``auto`` (Hermes
    blocks if the turn has any, else a Llama-3 JSON turn)."""
    if fmt == "hermes":
        return parse_hermes(text)
    if fmt == "llama3":
        return parse_llama3(text)
    if fmt != "auto":
        raise ValueError(f"tool call format must be 'auto', 'hermes' or 'llama3', got {fmt!r}")
    return parse_hermes(text) if "<tool_call>" in text else parse_llama3(text)


# ----------------------------------------------------------------------------- running


@dataclass
class ToolResult:
    name: str
    content: str
    failed: bool
    fault: str | None = None  # "exception", "timeout", "not_found", "malformed", "non_string", "truncated"


def _call(fn: Callable, arguments: dict[str, Any]) -> Any:
    result = fn(**arguments)
    if inspect.isawaitable(result):
        async def _await(awaitable):
            return await awaitable

        result = asyncio.run(_await(result))
    return result


def _call_with_timeout(fn: Callable, arguments: dict[str, Any], timeout_s: float | None) -> Any:
    """Run in a daemon thread; a call past the limit is abandoned (it keeps running in the background)."""
    if timeout_s is None:
        return _call(fn, arguments)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = _call(fn, arguments)
        except BaseException as e:  # noqa: BLE001 - reported as the tool's error
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="slimgrpo-tool")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(f"timed out after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class ToolRunner:
    """Runs parsed calls against a ``{name: callable}`` table and builds the tool messages.

    Args:
        timeout_s: wall-clock limit per call (None = none).
        max_output_chars: longer results are cut to this many characters plus a note.
        sandbox: a ``callable(fn, arguments, timeout_s) -> result`` that runs the tool elsewhere
            (``tool_sandbox.run_in_sandbox``); None runs it in this process.
        max_concurrent: most rows whose calls run at once in ``run_rows`` (threads; 1 = one row after
            another).
    """

    def __init__(self, timeout_s: float | None = 10.0, max_output_chars: int = 4000,
                 sandbox: Callable | None = None, max_concurrent: int = 1) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.sandbox = sandbox
        self.max_concurrent = max_concurrent

    def run_rows(self, turns: list[tuple[list[ToolCall], dict[str, Callable]]]) -> list[list[ToolResult]]:
        """``run_turn`` for the turn of each of several rows, up to ``max_concurrent`` rows at once in
        threads; the results are in row order whichever finishes first. Each call keeps its own time limit
        and result cap; a row's own calls run as in ``run_turn``."""
        workers = min(self.max_concurrent, len(turns))
        if workers <= 1:
            return [self.run_turn(calls, tools) for calls, tools in turns]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="slimgrpo-tools") as pool:
            return list(pool.map(lambda turn: self.run_turn(*turn), turns))  # map keeps the input order

    def run(self, call: ToolCall, tools: dict[str, Callable]) -> ToolResult:
        early = self._unrunnable(call, tools)
        if early is not None:
            return early
        try:
            if self.sandbox is not None:
                result = self.sandbox(tools[call.name], call.arguments, self.timeout_s)
            else:
                result = _call_with_timeout(tools[call.name], call.arguments, self.timeout_s)
        except Exception as e:  # noqa: BLE001 - any tool failure goes back to the model
            return self._failure(call, e)
        return self._success(call, result)

    def run_turn(self, calls: list[ToolCall], tools: dict[str, Callable]) -> list[ToolResult]:
        """The calls of one assistant turn, results in call order. Calls to ``async def`` tools are awaited
        together (``asyncio.gather``, each under ``timeout_s``), so two 0.3 s network calls take 0.3 s, not
        0.6 s; other tools run one after another."""
        concurrent = [i for i, c in enumerate(calls)
                      if self.sandbox is None and self._unrunnable(c, tools) is None and _is_async(tools[c.name])]
        results: dict[int, ToolResult] = {}
        if len(concurrent) > 1:
            outcomes = _await_together([(tools[calls[i].name], calls[i].arguments) for i in concurrent],
                                       self.timeout_s)
            for i, outcome in zip(concurrent, outcomes):
                results[i] = (self._failure(calls[i], outcome) if isinstance(outcome, BaseException)
                              else self._success(calls[i], outcome))
        return [results[i] if i in results else self.run(c, tools) for i, c in enumerate(calls)]

    @staticmethod
    def _unrunnable(call: ToolCall, tools: dict[str, Callable]) -> ToolResult | None:
        if call.error is not None:
            return ToolResult(call.name, str({"error": call.error}), True, "malformed")
        if tools.get(call.name) is None:
            return ToolResult(call.name, str({"error": f"Tool {call.name} not found."}), True, "not_found")
        return None

    def _failure(self, call: ToolCall, e: BaseException) -> ToolResult:
        if isinstance(e, TimeoutError):
            return ToolResult(call.name, str({"error": f"Tool {call.name} timed out after {self.timeout_s:g} s"}),
                              True, "timeout")
        return ToolResult(call.name, str({"error": str(e)}), True, "exception")

    def _success(self, call: ToolCall, result: Any) -> ToolResult:
        fault = None
        if not isinstance(result, str):
            # str(result) as in TRL; numbers are ordinary results, anything else is counted.
            fault = None if isinstance(result, (int, float, bool)) else "non_string"
            try:
                content = str(result)
            except Exception as e:  # noqa: BLE001 - a result whose __str__ raises
                return ToolResult(call.name, str({"error": f"result of {call.name} has no text form: {e}"}),
                                  True, "exception")
        else:
            content = result
        if len(content) > self.max_output_chars:
            cut = len(content) - self.max_output_chars
            content = content[: self.max_output_chars] + f"... [truncated {cut} characters]"
            fault = "truncated"
        return ToolResult(call.name, content, False, fault)


def _is_async(fn: Callable) -> bool:
    """``async def`` functions and objects whose ``__call__`` is one (environment methods are bound methods)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _await_together(calls: list[tuple[Callable, dict[str, Any]]], timeout_s: float | None) -> list[Any]:
    """Await ``fn(**arguments)`` of every call in one event loop; each outcome is a result or the exception.

    ``asyncio.wait_for`` bounds each call; a coroutine that blocks the loop (``time.sleep`` inside
    ``async def``) cannot be cancelled, so the whole gather also runs in a watched thread: past
    ``timeout_s`` plus a second, every call of the turn is reported as timed out."""

    async def one(fn: Callable, arguments: dict[str, Any]) -> Any:
        try:
            return await asyncio.wait_for(fn(**arguments), timeout_s)
        except asyncio.TimeoutError:  # a distinct class before Python 3.11
            raise TimeoutError(f"timed out after {timeout_s:g} s") from None

    async def gather() -> list[Any]:
        return await asyncio.gather(*(one(fn, a) for fn, a in calls), return_exceptions=True)

    runner = (lambda: asyncio.run(gather()))  # noqa: E731
    try:
        return _call_with_timeout(runner, {}, None if timeout_s is None else timeout_s + 1.0)
    except TimeoutError as e:
        return [e] * len(calls)


def tool_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def split_tools(tools: list[Callable]) -> dict[str, Callable]:
    """``{name: callable}``; two tools with one name is an error (the model could not tell them apart)."""
    table: dict[str, Callable] = {}
    for fn in tools:
        name = tool_name(fn)
        if name in table and table[name] is not fn:
            raise ValueError(f"two tools are named {name!r}: rename one (the model calls tools by name)")
        table[name] = fn
    return table


__all__ = ["ToolCall", "ToolResult", "ToolRunner", "parse_hermes", "parse_llama3", "parse_tool_calls",
           "split_tools", "tool_name"]
