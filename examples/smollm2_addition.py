"""Addition word-free problems for SmolLM2-135M-Instruct: data maker and rewards (TRL's reward contract).

    python examples/smollm2_addition.py --make-data examples/data   # writes train.jsonl and heldout.jsonl

Each row is ``{"prompt": [{"role": "user", "content": "What is 7 + 12? Reply with only the number."}],
"answer": "19"}``. The pairs (a, b) with 1 <= a, b <= 20 are split once, by a fixed shuffle, into 300 for
training and 100 held out, so no held-out question is ever seen while training.

The base model answers 10-15% of these correctly (it rambles, mis-adds or restates the question), so the
accuracy reward is above zero from the start, and GRPO has something to compare within a group.
Both rewards take ``(prompts, completions, **columns)`` and work unchanged in TRL's GRPOTrainer.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

INSTRUCTION = "Reply with only the number."
_INTEGER = re.compile(r"-?\d+")


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))  # [{"role", "content"}]


def last_number_correct(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the last integer in the completion equals ``answer``, else 0.0."""
    scores = []
    for completion, gold in zip(completions, answer):
        numbers = _INTEGER.findall(_text(completion).replace(",", ""))
        scores.append(1.0 if numbers and int(numbers[-1]) == int(gold) else 0.0)
    return scores


def only_the_number(prompts, completions, **kwargs) -> list[float]:
    """Graded instruction following: 1.0 for a bare integer, down to 0.0 at 20 or more words (or no text)."""
    return [graded_brevity(_text(completion), r"-?\d+") for completion in completions]


def graded_brevity(text: str, bare: str) -> float:
    """1.0 when ``text`` (stripped, a trailing period dropped) matches the regex ``bare`` in full, 0.0 for no
    text, else 1 - words / 20 floored at 0 (the other recipes' format rewards share this grading)."""
    text = text.strip().rstrip(".")
    if re.fullmatch(bare, text):
        return 1.0
    if not text:
        return 0.0
    return max(0.0, 1.0 - len(text.split()) / 20.0)


def make_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}], "answer": str(a + b)}
            for a, b in pairs]
    return rows[:300], rows[300:]


def make_data_cli(description: str, make_rows, argv: list[str] | None = None) -> int:
    """``--make-data DIR``: a task's ``make_rows()`` split written by ``write_split`` (every recipe's maker)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--make-data", metavar="DIR", required=True, help="folder for train.jsonl and heldout.jsonl")
    args = parser.parse_args(argv)
    write_split(Path(args.make_data), *make_rows())
    return 0


def main(argv: list[str] | None = None) -> int:
    return make_data_cli(__doc__.splitlines()[0], make_rows, argv)


def write_split(out: Path, train: list[dict], heldout: list[dict]) -> None:
    """``out/train.jsonl`` and ``out/heldout.jsonl``; a file already there is left as it is (never overwritten)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        path = out / name
        if path.exists():
            print(f"{path} exists; leaving it as it is (delete it to make it again)", file=sys.stderr)
            continue
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    sys.exit(main())
