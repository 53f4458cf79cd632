"""Multiplication for SmolLM2-135M-Instruct: a task the recipes were never tuned on (issue 46's hidden-task check).

    python -m benchmarks.learning.learn_suite --tasks benchmarks/learning/tasks/smollm2_multiply.yaml --seeds 0 1 2 \
        --trainers slimgrpo

Each row is ``{"prompt": [{"role": "user", "content": "What is 7 * 12? Reply with only the number."}],
"answer": "84"}``. The pairs (a, b) with 1 <= a, b <= 20 are split once, by a fixed shuffle, into 300 for
training and 100 held out. The rewards are the addition recipe's (the last integer equals the answer; a graded
"only the number"), taken from examples/smollm2_addition.py. Both trainers load this file by its path (a
reward file), so it reaches that module by its path too.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

ADDITION = Path(__file__).resolve().parents[3] / "examples" / "smollm2_addition.py"


def _addition_module():
    """examples/smollm2_addition.py as the module ``smollm2_addition`` (loaded once per process)."""
    if "smollm2_addition" not in sys.modules:
        spec = importlib.util.spec_from_file_location("smollm2_addition", ADDITION)
        module = importlib.util.module_from_spec(spec)
        sys.modules["smollm2_addition"] = module
        spec.loader.exec_module(module)
    return sys.modules["smollm2_addition"]


_addition = _addition_module()
INSTRUCTION, make_data_cli = _addition.INSTRUCTION, _addition.make_data_cli
last_number_correct, only_the_number = _addition.last_number_correct, _addition.only_the_number

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
