"""The demo task: add two two-digit numbers, with a reward that checks the sum exactly.

A prompt is plain text such as ``"37+48="`` and its ``answer`` column holds the sum as a
decimal string (``"85"``). Both operands lie in 10..99, so every prompt is six characters
long and every answer is two or three digits: a model with a character-level tokenizer
needs at most four completion tokens (three digits and EOS).

The task is small enough that a 100K-parameter model learns it in a few minutes on a CPU,
and hard enough (the tens digit depends on the carry out of the units) that a short
supervised warm-start leaves the model only partly right, which is what GRPO needs: some
samples of a group are correct and some are not, so the group-relative advantages are
not all zero.
"""

from __future__ import annotations

import random
from typing import Any

OPERAND_MIN = 10
OPERAND_MAX = 99

# Special-token strings of the demo tokenizer; a completion decoded without
# ``skip_special_tokens`` may still contain them, and the rewards cut them off.
EOS_TEXT = "<eos>"
PAD_TEXT = "<pad>"

# The bundled split: data/train.jsonl and data/eval.jsonl are make_splits() with these.
NUM_TRAIN = 2000
NUM_EVAL = 200
DATA_SEED = 1234


def all_problems() -> list[tuple[int, int]]:
    """Every (a, b) operand pair of the task, in a fixed order (8,100 pairs)."""
    operands = range(OPERAND_MIN, OPERAND_MAX + 1)
    return [(a, b) for a in operands for b in operands]


def format_prompt(a: int, b: int) -> str:
    """The prompt text for ``a + b``, e.g. ``format_prompt(37, 48) == "37+48="``."""
    return f"{a}+{b}="


def make_row(a: int, b: int) -> dict[str, str]:
    """One dataset row: the prompt and the exact answer the reward compares against."""
    return {"prompt": format_prompt(a, b), "answer": str(a + b)}


def make_dataset(
    n: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()
) -> list[dict[str, str]]:
    """``n`` distinct problems drawn without replacement, in a seed-determined order.

    Prompts listed in ``exclude`` are never drawn, which is how the held-out split is
    kept disjoint from the training split. The same ``(n, seed, exclude)`` always gives
    the same rows, on any machine (Python's ``random.Random`` is platform-independent).
    """
    pool = [pair for pair in all_problems() if format_prompt(*pair) not in exclude]
    if not 0 <= n <= len(pool):
        raise ValueError(
            f"make_dataset: n={n} is out of range; the task has {len(pool)} problems "
            f"left after excluding {len(exclude)} prompts"
        )
    rng = random.Random(seed)
    return [make_row(a, b) for a, b in rng.sample(pool, n)]


def make_splits(
    num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, seed: int = DATA_SEED
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, eval) rows: the held-out eval rows are drawn first, then the training rows
    from the problems left over, so no eval prompt ever appears in training."""
    eval_rows = make_dataset(num_eval, seed)
    train_rows = make_dataset(num_train, seed + 1, exclude={r["prompt"] for r in eval_rows})
    return train_rows, eval_rows


def extract_answer(completion: str) -> str:
    """The answer a completion gives: its text before the first EOS, without padding or
    surrounding whitespace. Anything else left over (a second number, stray symbols)
    stays in and makes the answer wrong."""
    text = completion.split(EOS_TEXT, 1)[0].replace(PAD_TEXT, "")
    return text.strip()


def demo_accuracy(
    prompts: list[Any], completions: list[str], answer: list[str], **kwargs: Any
) -> list[float]:
    """1.0 where the completion's answer equals the row's ``answer`` exactly, else 0.0.

    Follows TRL's reward contract: one float per completion; ``answer`` is the dataset
    column of the same name, already repeated to line up with ``completions``; other
    columns and ``completion_ids`` arrive in ``kwargs`` and are ignored.
    """
    if len(completions) != len(answer):
        raise ValueError(
            f"demo_accuracy: got {len(completions)} completions but {len(answer)} answers; "
            "the answer column must be repeated once per completion"
        )
    return [
        1.0 if extract_answer(c) == str(a).strip() else 0.0
        for c, a in zip(completions, answer)
    ]


def demo_well_formed(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    """Optional shaping reward: 1.0 where the answer is a plain number of 1 to 3 digits.

    Not needed by the shipped demo (the warm-started model already answers with numbers),
    kept for experiments where the policy drifts into malformed output.
    """
    return [
        1.0 if (a := extract_answer(c)).isdigit() and 1 <= len(a) <= 3 else 0.0
        for c in completions
    ]
