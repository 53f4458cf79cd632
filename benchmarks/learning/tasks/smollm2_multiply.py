"""Multiplication for SmolLM2-135M-Instruct: a task the recipes were never tuned on (issue 46's hidden-task check).

    python benchmarks/learn_suite.py --tasks benchmarks/tasks/smollm2_multiply.yaml --seeds 0 1 2 --trainers slimgrpo

Each row is ``{"prompt": [{"role": "user", "content": "What is 7 * 12? Reply with only the number."}],
"answer": "84"}``. The pairs (a, b) with 1 <= a, b <= 20 are split once, by a fixed shuffle, into 300 for
training and 100 held out. The rewards are the addition recipe's (the last integer equals the answer; a graded
"only the number"), imported from examples/smollm2_addition.py.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from smollm2_addition import INSTRUCTION, last_number_correct, make_data_cli, only_the_number  # noqa: E402

__all__ = ["last_number_correct", "only_the_number", "make_rows", "main"]


def make_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * {b}? {INSTRUCTION}"}], "answer": str(a * b)}
            for a, b in pairs]
    return rows[:300], rows[300:]


def main(argv: list[str] | None = None) -> int:
    return make_data_cli(__doc__.splitlines()[0], make_rows, argv)


if __name__ == "__main__":
    sys.exit(main())
