"""Ordering three or four numbers, for SmolLM2-135M-Instruct: data maker and rewards (TRL's reward contract).

    python examples/smollm2_sort.py --make-data examples/data/sort   # writes train.jsonl and heldout.jsonl

Each row is ``{"prompt": [{"role": "user", "content": "Sort 17, 3, 9 from smallest to largest. Reply with the
numbers separated by commas."}], "answer": "3, 9, 17"}``: three or four different numbers from 1 to 50 in a
random order, drawn by a fixed seed. 400 distinct questions (as sets of numbers) are split once into 300 for
training and 100 held out.

Rewards take ``(prompts, completions, **columns)`` and work unchanged in TRL's GRPOTrainer:
``sorted_correct`` (1 when the last numbers of the completion, as many as asked, are the sorted list) and
``only_the_list`` (1 for the numbers separated by commas and nothing else, else 1 - words / 20).
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

try:
    from smollm2_addition import _text, graded_brevity, make_data_cli
except ImportError:  # loaded by file path without its folder on sys.path (slimgrpo puts it there itself)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from smollm2_addition import _text, graded_brevity, make_data_cli

INSTRUCTION = "Reply with the numbers separated by commas."
_INTEGER = re.compile(r"-?\d+")


def sorted_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last n integers are ``answer`` (n numbers, sorted, comma-separated), else 0.0."""
    scores = []
    for completion, gold in zip(completions, answer):
        want = [int(x) for x in gold.split(",")]
        got = [int(x) for x in _INTEGER.findall(_text(completion))]
        scores.append(1.0 if got[-len(want):] == want else 0.0)
    return scores


def only_the_list(prompts, completions, **kwargs) -> list[float]:
    """Graded instruction following: 1.0 for integers separated by commas only, down to 0.0 at 20 words."""
    return [graded_brevity(_text(c), r"-?\d+(\s*,\s*-?\d+)+") for c in completions]


def make_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """300 training and 100 held-out rows, the same on every call (no set of numbers in both)."""
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    rows = []
    while len(rows) < 400:
        numbers = rng.sample(range(1, 51), rng.choice((3, 4)))
        key = tuple(sorted(numbers))
        if key in seen:
            continue
        seen.add(key)
        text = f"Sort {', '.join(map(str, numbers))} from smallest to largest. {INSTRUCTION}"
        rows.append({"prompt": [{"role": "user", "content": text}], "answer": ", ".join(map(str, key))})
    return rows[:300], rows[300:]


def main(argv: list[str] | None = None) -> int:
    return make_data_cli(__doc__.splitlines()[0], make_rows, argv)


if __name__ == "__main__":
    sys.exit(main())
