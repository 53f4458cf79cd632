"""Two-step word problems for SmolLM2-135M-Instruct: data maker and rewards (TRL's reward contract).

    python examples/smollm2_word_problems.py --make-data examples/data/word_problems   # train.jsonl, heldout.jsonl

Each row is ``{"prompt": [{"role": "user", "content": "Tom has 3 apples and buys 4 more, then gives 2 away.
How many apples does Tom have now? Reply with only the number."}], "answer": "5"}``: a start between 2 and 9,
a gain between 1 and 9, a loss below their sum, with a name and an object drawn by a fixed seed. 400 distinct
questions are split once, by a fixed shuffle, into 300 for training and 100 held out.

The answer is one integer, so the rewards are the addition recipe's (examples/smollm2_addition.py):
``last_number_correct`` (accuracy) and ``only_the_number`` (graded brevity). Both take
``(prompts, completions, **columns)`` and work unchanged in TRL's GRPOTrainer.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

try:
    from smollm2_addition import INSTRUCTION, last_number_correct, only_the_number, make_data_cli
except ImportError:  # loaded by file path without its folder on sys.path (slimgrpo puts it there itself)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from smollm2_addition import INSTRUCTION, last_number_correct, only_the_number, make_data_cli

__all__ = ["last_number_correct", "only_the_number", "make_rows", "main"]

NAMES = ["Tom", "Anna", "Ben", "Lucy", "Sam", "Mia", "Leo", "Emma"]
THINGS = [("apples", "buys"), ("stickers", "gets"), ("marbles", "finds"), ("books", "buys"), ("pencils", "gets")]


def question(name: str, things: str, verb: str, start: int, gain: int, loss: int) -> str:
    return (f"{name} has {start} {things} and {verb} {gain} more, then gives {loss} away. "
            f"How many {things} does {name} have now? {INSTRUCTION}")


def make_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """300 training and 100 held-out rows, the same on every call (no question in both)."""
    rng = random.Random(seed)
    triples = [(s, g, l) for s in range(2, 10) for g in range(1, 10) for l in range(1, s + g)]
    rng.shuffle(triples)
    rows = []
    for start, gain, loss in triples[:400]:
        name = rng.choice(NAMES)
        things, verb = rng.choice(THINGS)
        rows.append({"prompt": [{"role": "user", "content": question(name, things, verb, start, gain, loss)}],
                     "answer": str(start + gain - loss)})
    return rows[:300], rows[300:]


def main(argv: list[str] | None = None) -> int:
    return make_data_cli(__doc__.splitlines()[0], make_rows, argv)


if __name__ == "__main__":
    sys.exit(main())
