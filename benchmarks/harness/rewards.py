"""The benchmarks' reward: cheap, deterministic, and usable by both trainers.

TRL calls it as ``fn(prompts=..., completions=..., completion_ids=..., **columns)``; slimgrpo loads it
with ``rewards.functions=[benchmarks/harness/rewards.py:digit_reward]`` (``DIGIT_REWARD``, this file's absolute
path) and calls it the same way. Its value does not matter for speed or memory; it only has to vary within a
group so advantages are non-zero. Both trainers load this file by its path: it imports nothing but the standard
library.
"""

from __future__ import annotations

from pathlib import Path

DIGIT_REWARD = f"{Path(__file__).resolve()}:digit_reward"  # as rewards.functions / the TRL child's spec name it


def _text(completion) -> str:
    if isinstance(completion, str):
        return completion
    # conversational completions: [{"role": "assistant", "content": ...}]
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def digit_reward(prompts, completions, **kwargs) -> list[float]:
    """Fraction of the completion's characters that are digits (0.0 for an empty completion)."""
    scores = []
    for c in completions:
        text = _text(c)
        scores.append(sum(ch.isdigit() for ch in text) / len(text) if text else 0.0)
    return scores
