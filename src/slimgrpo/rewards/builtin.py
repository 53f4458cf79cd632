"""Built-in reward functions, all following TRL's contract::

    fn(prompts, completions, completion_ids=..., **columns) -> list[float | None]

``prompts`` and ``completions`` hold one entry per completion row (prompts repeated per generation),
each a string or a conversation (list of ``{"role", "content"}`` messages). Extra dataset columns
arrive as keyword lists, one value per row. ``None`` means "not applicable" for that row.

Registered names (``BUILTIN_REWARDS``): ``gsm8k_accuracy``, ``boxed_accuracy``, ``format_strict``,
``format_lenient``, ``format_reasoning_strict``, ``format_reasoning_lenient``, ``length`` and
``code_execution``. Factories build variants: ``make_format_reward``, ``make_length_reward``,
``make_code_execution_reward``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slimgrpo.rewards.answers import (
    answer_value,
    completion_text,
    gold_answer,
    last_boxed,
    model_answer,
    normalize_math_string,
    normalize_number,
    parse_number,
)
from slimgrpo.rewards.sandbox import SandboxLimits, run_sandboxed

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFunction",
    "boxed_accuracy",
    "code_execution_reward",
    "extract_code_block",
    "format_lenient",
    "format_strict",
    "gsm8k_accuracy",
    "length_reward",
    "make_code_execution_reward",
    "make_format_reward",
    "make_length_reward",
    "normalize_number",
]

RewardFunction = Callable[..., list]


def _column(name: str, fn_name: str, values: Any, rows: int) -> list:
    """Check that a dataset column reached the reward function with one value per row."""
    if values is None:
        raise ValueError(
            f"{fn_name} needs a dataset column named {name!r} (one value per prompt); "
            f"add it to your dataset or use another reward function"
        )
    values = list(values)
    if len(values) != rows:
        raise ValueError(f"{fn_name}: column {name!r} has {len(values)} values for {rows} completions")
    return values


# --------------------------------------------------------------------------------------- accuracy


def gsm8k_accuracy(prompts: Sequence, completions: Sequence, answer: Sequence | None = None, **kwargs) -> list:
    """1.0 when the model's final number equals the gold answer, else 0.0.

    Gold: the text after the last ``####`` of the ``answer`` column (or the whole value when it has
    none). Model: the content of ``<answer>...</answer>``, else the last ``\\boxed{}``, else what
    follows ``####``, else the last number of the completion. Both go through ``parse_number`` and are
    compared exactly (``1,234`` == ``1234``, ``$18`` == ``18.00``, ``3/4`` == ``0.75``).
    A gold answer that is not a number is compared as a normalised string; a missing one gives ``None``.
    """
    golds = _column("answer", "gsm8k_accuracy", answer, len(completions))
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds):
        gold_text = gold_answer(gold)
        if gold_text is None:
            rewards.append(None)
            continue
        segment = model_answer(completion_text(completion))
        gold_value = parse_number(gold_text)
        if gold_value is None:
            same = segment is not None and normalize_math_string(segment) == normalize_math_string(gold_text)
        else:
            same = answer_value(segment) == gold_value
        rewards.append(1.0 if same else 0.0)
    return rewards


def boxed_accuracy(prompts: Sequence, completions: Sequence, answer: Sequence | None = None, **kwargs) -> list:
    """1.0 when the last ``\\boxed{...}`` of the completion matches the ``answer`` column, else 0.0.

    Nested braces are handled (``\\boxed{\\frac{1}{2}}``). When the gold answer itself contains a
    ``\\boxed{}`` (a MATH-style solution) its last one is used. Two answers match when both parse as
    the same number, or when their ``normalize_math_string`` forms are equal. No box scores 0.0; a
    missing gold answer gives ``None``.
    """
    golds = _column("answer", "boxed_accuracy", answer, len(completions))
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds):
        if gold is None or str(gold).strip() == "":
            rewards.append(None)
            continue
        gold_text = last_boxed(str(gold)) or str(gold)
        boxed = last_boxed(completion_text(completion))
        if boxed is None:
            rewards.append(0.0)
            continue
        a, b = parse_number(boxed), parse_number(gold_text)
        if a is not None and b is not None:
            same = a == b
        else:
            same = normalize_math_string(boxed) == normalize_math_string(gold_text)
        rewards.append(1.0 if same else 0.0)
    return rewards


# ----------------------------------------------------------------------------------------- format


def make_format_reward(
    think: str = "think", answer: str = "answer", strict: bool = True, name: str | None = None
) -> RewardFunction:
    """A reward of 1.0 for completions laid out as reasoning tags then answer tags, else 0.0.

    strict: the whole completion (surrounding whitespace allowed) must be exactly
        ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>``; the sections may not contain the tags.
    lenient: somewhere in the completion, ``<think>...</think>`` followed (not necessarily directly)
        by ``<answer>...</answer>``; newlines anywhere.
    ``think``/``answer`` rename the tags, e.g. ``make_format_reward(think="reasoning")``.
    """
    for tag in (think, answer):
        if not re.fullmatch(r"[A-Za-z_][\w\-]*", tag or ""):
            raise ValueError(f"make_format_reward: tag name {tag!r} must be a word such as 'think'")
    t, a = re.escape(think), re.escape(answer)
    no_tags = rf"(?:(?!</?{t}>|</?{a}>).)*?"
    if strict:
        pattern = re.compile(rf"\s*<{t}>\n{no_tags}\n</{t}>\n<{a}>\n{no_tags}\n</{a}>\s*", re.DOTALL)
        check = pattern.fullmatch
    else:
        pattern = re.compile(rf"<{t}>.*?</{t}>.*?<{a}>.*?</{a}>", re.DOTALL)
        check = pattern.search
    mode = "strict" if strict else "lenient"
    if name is None:  # format_strict, format_reasoning_strict, format_reasoning_final_lenient, ...
        renamed = [tag for tag, default in ((think, "think"), (answer, "answer")) if tag != default]
        name = "_".join(["format", *renamed, mode])

    def format_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list:
        return [1.0 if check(completion_text(c)) else 0.0 for c in completions]

    format_reward.__name__ = format_reward.__qualname__ = name
    format_reward.__doc__ = (
        f"{mode.capitalize()} format reward: 1.0 for <{think}>...</{think}> then <{answer}>...</{answer}>, "
        f"else 0.0 (built by make_format_reward)."
    )
    return format_reward


format_strict = make_format_reward(strict=True)
format_lenient = make_format_reward(strict=False)
format_reasoning_strict = make_format_reward(think="reasoning", strict=True)
format_reasoning_lenient = make_format_reward(think="reasoning", strict=False)


# ----------------------------------------------------------------------------------------- length


def make_length_reward(
    target_tokens: int, *, min_tokens: int = 0, max_tokens: int | None = None, name: str = "length"
) -> RewardFunction:
    """A piecewise-linear reward on completion length in tokens (``len(completion_ids[i])``)::

        reward
          1 |        __________
            |       /          \\
          0 |______/            \\______
            0   min_tokens  target  max_tokens   tokens

    * ``length < min_tokens``: rises linearly from 0.0 (empty) to 1.0 (discourages empty answers);
    * ``min_tokens <= length <= target_tokens``: 1.0;
    * ``target_tokens < length < max_tokens``: falls linearly from 1.0 to 0.0;
    * ``length >= max_tokens``: 0.0. ``max_tokens`` defaults to ``2 * target_tokens``.
    """
    if max_tokens is None:
        max_tokens = 2 * target_tokens
    if not 0 <= min_tokens <= target_tokens < max_tokens:
        raise ValueError(
            "make_length_reward needs 0 <= min_tokens <= target_tokens < max_tokens, got "
            f"min_tokens={min_tokens}, target_tokens={target_tokens}, max_tokens={max_tokens}"
        )

    def shape(length: int) -> float:
        if length < min_tokens:
            return length / min_tokens
        if length <= target_tokens:
            return 1.0
        if length >= max_tokens:
            return 0.0
        return (max_tokens - length) / (max_tokens - target_tokens)

    def length_reward(prompts: Sequence, completions: Sequence, completion_ids: Sequence | None = None, **kwargs):
        if completion_ids is None:
            raise ValueError(f"{name}: needs completion_ids (token ids of each completion), got None")
        if len(completion_ids) != len(completions):
            raise ValueError(f"{name}: {len(completion_ids)} completion_ids for {len(completions)} completions")
        return [shape(len(ids)) for ids in completion_ids]

    length_reward.__name__ = length_reward.__qualname__ = name
    length_reward.__doc__ = (
        f"Length reward: 1.0 for {min_tokens}..{target_tokens} tokens, 0.0 from {max_tokens} tokens "
        "(built by make_length_reward)."
    )
    return length_reward


length_reward = make_length_reward(target_tokens=512)
"""Registered as ``length``: 1.0 up to 512 tokens, falling linearly to 0.0 at 1024 tokens."""


# ------------------------------------------------------------------------------------------- code

_FENCE = re.compile(r"```[ \t]*([\w+\-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code_block(text: str) -> str | None:
    """The last fenced block tagged ``python``/``py``/``python3``, else the last untagged fenced block."""
    blocks = _FENCE.findall(text or "")
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    untagged = [code for lang, code in blocks if lang == ""]
    chosen = python or untagged
    return chosen[-1] if chosen else None


def make_code_execution_reward(
    timeout_s: float = 5.0, memory_mb: int = 512, max_workers: int | None = None, name: str = "code_execution"
) -> RewardFunction:
    """A reward of 1.0 when the completion's code passes its tests in the sandbox, else 0.0.

    The code is the last ```` ```python ```` fenced block of the completion (0.0 when there is none);
    the tests come from the ``test_code`` or ``tests`` column (a string, or a list of assert lines)
    and are appended to the code. The program runs through ``run_sandboxed`` (fresh temporary
    directory, empty environment, time/memory/output limits, no network, no subprocesses) and scores
    1.0 when it exits with status 0. A row whose tests are ``None`` gives ``None``. Programs run
    ``max_workers`` at a time (default: the number of CPUs, at most 8).
    """
    workers = max_workers or min(8, os.cpu_count() or 1)

    def run_one(code: str | None, tests: Any) -> float | None:
        if tests is None:
            return None
        if code is None:
            return 0.0
        if isinstance(tests, (list, tuple)):
            tests = "\n".join(str(t) for t in tests)
        program = f"{code}\n\n{tests}\n"
        result = run_sandboxed(program, limits=SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb))
        return 1.0 if result.ok else 0.0

    def code_execution_reward(prompts: Sequence, completions: Sequence, **kwargs) -> list:
        column = "test_code" if kwargs.get("test_code") is not None else "tests"
        tests = _column(column, name, kwargs.get(column), len(completions))
        codes = [extract_code_block(completion_text(c)) for c in completions]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(run_one, codes, tests))

    code_execution_reward.__name__ = code_execution_reward.__qualname__ = name
    code_execution_reward.__doc__ = make_code_execution_reward.__doc__
    return code_execution_reward


code_execution_reward = make_code_execution_reward()


BUILTIN_REWARDS: dict[str, RewardFunction] = {
    "gsm8k_accuracy": gsm8k_accuracy,
    "boxed_accuracy": boxed_accuracy,
    "format_strict": format_strict,
    "format_lenient": format_lenient,
    "format_reasoning_strict": format_reasoning_strict,
    "format_reasoning_lenient": format_reasoning_lenient,
    "length": length_reward,
    "code_execution": code_execution_reward,
}
"""Reward functions usable by name in a config (``rewards.functions: [gsm8k_accuracy, format_strict]``)."""
