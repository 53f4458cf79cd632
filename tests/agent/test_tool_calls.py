"""Tool-call parsing (Hermes, Llama 3 JSON) and running with faults (raise, hang, non-string, huge, malformed)."""

from __future__ import annotations

import asyncio
import time

import pytest

from slimgrpo.agent.environments import Toolbox
from slimgrpo.agent.tool_calls import ToolCall, ToolRunner, parse_tool_calls


def test_hermes_calls_with_text_around_and_several_blocks():
    text = ('I will compute.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 3}"}</tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("add", {"a": 1, "b": 2}, None),
                                                               ("mul", {"a": 3}, None)]


def test_hermes_malformed_json_and_missing_name_are_error_calls():
    calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>'
                             '<tool_call>{"x": 1}</tool_call>')
    assert [c.error is not None for c in calls] == [True, True]
    assert "invalid JSON" in calls[0].error and "'name'" in calls[1].error


def test_llama3_json_turns():
    calls = parse_tool_calls('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                             '{"name": "add", "parameters": {"a": 1}}')
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"}), ("add", {"a": 1})]
    assert parse_tool_calls("The answer is 4.") == []
    assert parse_tool_calls('{"answer": 4}') == []  # JSON that is not a call
    assert parse_tool_calls('{"name": "add", "parameters": {"a": 1}', "llama3")[0].error is not None
    assert parse_tool_calls("<tool_call>{}</tool_call>", "llama3") == []  # format pinned
    with pytest.raises(ValueError, match="format"):
        parse_tool_calls("", "xml")


def boom(x: int) -> int:
    raise RuntimeError("kaput")


def sleepy(x: int) -> str:
    time.sleep(5)
    return "late"


def as_dict(x: int) -> dict:
    return {"x": x}


def huge(x: int) -> str:
    return "y" * 10_000


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


TABLE = {f.__name__: f for f in (boom, sleepy, as_dict, huge, async_add)}


@pytest.mark.parametrize("call, content, failed, fault", [
    (ToolCall("boom", {"x": 1}), "{'error': 'kaput'}", True, "exception"),
    (ToolCall("nope", {}), "{'error': 'Tool nope not found.'}", True, "not_found"),
    (ToolCall("as_dict", {"x": 2}), "{'x': 2}", False, "non_string"),
    (ToolCall("async_add", {"a": 2, "b": 5}), "7", False, None),  # str(result), as TRL
    (ToolCall("unknown", error="Malformed tool call: invalid JSON"), "{'error': 'Malformed tool call: invalid JSON'}",
     True, "malformed"),
])
def test_runner_faults_become_tool_messages(call, content, failed, fault):
    res = ToolRunner(timeout_s=2).run(call, TABLE)
    assert (res.content, res.failed, res.fault) == (content, failed, fault)


def test_runner_timeout_and_truncation():
    t = time.perf_counter()
    res = ToolRunner(timeout_s=0.2).run(ToolCall("sleepy", {"x": 1}), TABLE)
    assert time.perf_counter() - t < 2
    assert res.failed and res.fault == "timeout" and "timed out after 0.2 s" in res.content
    res = ToolRunner(max_output_chars=100).run(ToolCall("huge", {"x": 1}), TABLE)
    assert not res.failed and res.fault == "truncated"
    assert res.content.startswith("y" * 100) and res.content.endswith("[truncated 9900 characters]")


async def fetch_a(x: int) -> str:
    await asyncio.sleep(0.3)
    return f"a{x}"


async def fetch_b(x: int) -> str:
    await asyncio.sleep(0.3)
    return f"b{x}"


async def fetch_slow(x: int) -> str:
    await asyncio.sleep(5)
    return "late"


ASYNC = {f.__name__: f for f in (fetch_a, fetch_b, fetch_slow, boom)}


def test_async_tools_of_one_turn_are_awaited_together():
    """Two 0.3 s async tools of one turn take about 0.3 s, not 0.6 s (a generous bound: a behavioural check)."""
    calls = [ToolCall("fetch_a", {"x": 1}), ToolCall("boom", {"x": 2}), ToolCall("fetch_b", {"x": 3}),
             ToolCall("missing", {})]
    t = time.perf_counter()
    results = ToolRunner(timeout_s=10).run_turn(calls, ASYNC)
    assert time.perf_counter() - t < 0.5
    assert [r.content for r in results] == ["a1", "{'error': 'kaput'}", "b3", "{'error': 'Tool missing not found.'}"]
    assert [r.fault for r in results] == [None, "exception", None, "not_found"]


def test_each_async_tool_of_a_turn_keeps_its_own_timeout():
    t = time.perf_counter()
    results = ToolRunner(timeout_s=0.5).run_turn([ToolCall("fetch_slow", {"x": 1}), ToolCall("fetch_a", {"x": 2})],
                                                 ASYNC)
    assert time.perf_counter() - t < 2
    assert results[0].fault == "timeout" and "timed out after 0.5 s" in results[0].content
    assert results[1].content == "a2" and not results[1].failed


def test_wrong_arguments_are_an_exception_message():
    res = ToolRunner().run(ToolCall("boom", {"y": 1}), TABLE)
    assert res.failed and "unexpected keyword argument 'y'" in res.content


class Env:
    made = 0

    def __init__(self):
        Env.made += 1
        self.seen = None

    def reset(self, **row):
        self.seen = row
        return " (extra)"

    def act(self, move: str) -> str:
        """Make a move.

        Args:
            move: the move
        """
        return move

    def _private(self):
        pass

    def get_reward(self) -> float:
        return 0.5


class Other:
    def reset(self, **row):
        return None

    def other_tool(self, x: int) -> int:
        """Echo.

        Args:
            x: a number
        """
        return x


def test_toolbox_pools_instances_and_exposes_public_methods():
    Env.made = 0
    box = Toolbox([async_add], {"env": Env, "other": Other})
    rows = [{"prompt": "p", "environment": "env", "answer": 1}] * 3 + [{"prompt": "q", "environment": "other"}]
    obs = box.assign(rows)
    assert obs == [" (extra)"] * 3 + [None]
    assert box.environments[0].seen == {"prompt": "p", "answer": 1}  # the routing column is not passed
    assert len({id(e) for e in box.environments}) == 4 and Env.made == 3
    box.assign(rows)
    assert Env.made == 3  # reused across steps
    assert [t.__name__ for t in box.row_tools(0)] == ["async_add", "act"]
    assert [t.__name__ for t in box.row_tools(3)] == ["async_add", "other_tool"]
    [(name, fn)] = box.reward_functions()
    assert name == "Env" and fn(environments=box.environments) == [0.5, 0.5, 0.5, None]
    with pytest.raises(ValueError, match="'nope' is not among"):
        box.assign([{"prompt": "p", "environment": "nope"}])


def test_environment_without_reset_is_refused():
    class NoReset:
        def act(self, x: int) -> int:
            return x

    with pytest.raises(ValueError, match="reset"):
        Toolbox(None, NoReset)


SANDBOX_TOOL = '''
def square(x: int) -> int:
    """Square a number.

    Args:
        x: the number
    """
    return x * x


def escape(path: str) -> str:
    """Read a file.

    Args:
        path: the file
    """
    return open(path).read()
'''


def test_sandboxed_tools_run_in_a_child_and_cannot_read_files(tmp_path):
    from slimgrpo.agent.setup import load_spec, sandboxed_call

    (tmp_path / "sq.py").write_text(SANDBOX_TOOL)
    square = load_spec("sq.py:square", str(tmp_path), "rollout.tools[0]")
    escape = load_spec("sq.py:escape", str(tmp_path), "rollout.tools[1]")
    runner = ToolRunner(timeout_s=10, sandbox=sandboxed_call)
    assert runner.run(ToolCall("square", {"x": 7}), {"square": square}).content == "49"
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    res = runner.run(ToolCall("escape", {"path": str(secret)}), {"escape": escape})
    assert res.failed and "s3cret" not in res.content
