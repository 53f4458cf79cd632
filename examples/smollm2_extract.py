"""Extracting a field from a short text, for SmolLM2-135M-Instruct: data maker and rewards (TRL's contract).

    python examples/smollm2_extract.py --make-data examples/data/extract   # writes train.jsonl and heldout.jsonl

Each row is ``{"prompt": [{"role": "user", "content": "Order #4821 was packed in Oslo and shipped to Lisbon
on 12 May. Which city was it shipped to? Reply with only the city."}], "answer": "Lisbon", "other": "Oslo"}``:
two different cities, an order number and a date drawn by a fixed seed. 400 distinct texts are split once
into 300 for training and 100 held out, and no (packed, shipped) city pair of a held-out text occurs in
training, so the model cannot learn the answers by heart.

Rewards take ``(prompts, completions, **columns)`` and work unchanged in TRL's GRPOTrainer:
``city_correct`` (1 when the completion names the destination and not the other city) and ``only_the_city``
(1 for the city alone, else 1 - words / 20).
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

CITIES = ["Lisbon", "Oslo", "Madrid", "Paris", "Berlin", "Vienna", "Dublin", "Prague", "Rome", "Athens",
          "Warsaw", "Helsinki", "Zurich", "Brussels", "Stockholm", "Budapest", "Amsterdam", "Copenhagen", "Milan",
          "Munich"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
INSTRUCTION = "Reply with only the city."


def _mentions(text: str, city: str) -> bool:
    return re.search(rf"\b{re.escape(city.lower())}\b", text.lower()) is not None


def city_correct(prompts, completions, answer, other, **kwargs) -> list[float]:
    """1.0 when the completion names the destination city (``answer``) and not the other one, else 0.0."""
    return [1.0 if _mentions(_text(c), gold) and not _mentions(_text(c), wrong) else 0.0
            for c, gold, wrong in zip(completions, answer, other)]


def only_the_city(prompts, completions, **kwargs) -> list[float]:
    """Graded instruction following: 1.0 for one capitalised word (a city), down to 0.0 at 20 words or no text."""
    return [graded_brevity(_text(c), r"[A-Z][a-z]+") for c in completions]


def make_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """300 training and 100 held-out rows, the same on every call; held-out city pairs never occur in training."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in CITIES for b in CITIES if a != b]  # 380 (packed, shipped) pairs
    rng.shuffle(pairs)
    held_pairs, train_pairs = pairs[:100], pairs[100:]

    def row(packed: str, shipped: str) -> dict:
        order, day, month = rng.randint(1000, 9999), rng.randint(1, 28), rng.choice(MONTHS)
        text = (f"Order #{order} was packed in {packed} and shipped to {shipped} on {day} {month}. "
                f"Which city was it shipped to? {INSTRUCTION}")
        return {"prompt": [{"role": "user", "content": text}], "answer": shipped, "other": packed}

    heldout = [row(*p) for p in held_pairs]
    train = [row(*train_pairs[i % len(train_pairs)]) for i in range(300)]  # 280 pairs, 20 twice (new texts)
    return train, heldout


def main(argv: list[str] | None = None) -> int:
    return make_data_cli(__doc__.splitlines()[0], make_rows, argv)


if __name__ == "__main__":
    sys.exit(main())
