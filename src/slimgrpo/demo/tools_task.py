"""The tool demo task: sums a tiny model cannot do in its head, and a calculator it can call.

Prompts are ``"4821+3967="`` (four-digit operands, "hard") or ``"3+4="`` (one-digit, "easy"); the answer
column holds the sum. The model may answer at once (``8788<eos>``) or call the ``add`` tool first::

    4821+3967=<tool_call>{"name": "add", "arguments": {"a": 4821, "b": 3967}}</tool_call><eos>
    <tool>8788<eos>8788<eos>

The bundled model (``scripts/build_tool_demo_model.py``) was warm-started to call the tool on only a
fifth of the problems, whatever their size, and to answer directly otherwise: it knows the easy sums but
not the hard ones. GRPO teaches it *when* to call: the hard sums.
"""

from __future__ import annotations

import random
from typing import Any

from slimgrpo.demo.task import EOS_TEXT, PAD_TEXT

NUM_TRAIN = 2000
NUM_EVAL = 200
DATA_SEED = 4321
EASY_FRACTION = 0.25

# The call is spelled with three multi-character tokens of the demo tokenizer; together with the digits
# they give exactly the JSON that the chat template's ``tojson`` writes for the call.
CALL_OPEN = '<tool_call>{"name": "add", "arguments": {"a": '
CALL_MID = ', "b": '
CALL_CLOSE = "}}</tool_call>"
TOOL_TEXT = "<tool>"

# Renders tools as nothing (the model has one tool and learned its format in the warm-start), calls in
# the Hermes style, tool results as ``<tool>result<eos>``; no generation prompt.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}{{ m.content }}"
    "{%- for c in (m.tool_calls or []) -%}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{%- endfor -%}"
    "<eos>"
    "{%- elif m.role == 'tool' -%}<tool>{{ m.content }}<eos>"
    "{%- else -%}{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: the first number
        b: the second number
    """
    return int(a) + int(b)


def make_row(a: int, b: int) -> dict[str, str]:
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


def make_splits(num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, seed: int = DATA_SEED):
    """(train, eval) rows, disjoint; a quarter easy (one-digit) problems, the rest four-digit."""
    rng = random.Random(seed)
    seen: set[str] = set()

    def draw(n):
        rows = []
        while len(rows) < n:
            if rng.random() < EASY_FRACTION:
                row = make_row(rng.randint(0, 9), rng.randint(0, 9))
                rows.append(row)  # only 100 easy problems: they repeat, and appear in both splits
                continue
            row = make_row(rng.randint(1000, 9999), rng.randint(1000, 9999))
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
        return rows

    eval_rows = draw(num_eval)
    return draw(num_train), eval_rows


def final_answer(completion: Any) -> str:
    """The last assistant message's text (a conversation), or the text itself."""
    if isinstance(completion, list):
        messages = [m for m in completion if m.get("role") == "assistant"]
        text = messages[-1].get("content", "") if messages else ""
        if messages and messages[-1].get("tool_calls"):
            return ""  # ended on an unanswered call
    else:
        text = completion
    return text.split(EOS_TEXT, 1)[0].replace(PAD_TEXT, "").strip()


def tool_accuracy(prompts: list[Any], completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the final answer equals the sum exactly."""
    return [1.0 if final_answer(c) == str(a) else 0.0 for c, a in zip(completions, answer)]


__all__ = ["CALL_CLOSE", "CALL_MID", "CALL_OPEN", "CHAT_TEMPLATE", "TOOL_TEXT", "add", "final_answer",
           "make_splits", "tool_accuracy"]
