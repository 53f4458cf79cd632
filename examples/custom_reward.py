"""A user's own reward function with extra dataset columns, the way TRL users write them.

slimgrpo calls ``countdown_reward(prompts, completions, completion_ids=..., numbers=[...], target=[...])``:
every column of the dataset other than the prompt arrives as a keyword list, one value per completion.
Return one float per completion, or None where the reward does not apply.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
import sys
from collections import Counter

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(node):
    """Arithmetic only: numbers and + - * / (no names, calls or attributes, so no code runs)."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not plain arithmetic")


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def countdown_reward(prompts, completions, numbers, target, **kwargs) -> list[float | None]:
    scores: list[float | None] = []
    for completion, nums, goal in zip(completions, numbers, target):
        match = re.search(r"<answer>(.*?)</answer>", _text(completion), flags=re.S)
        if not match:
            scores.append(0.0)
            continue
        equation = match.group(1).strip()
        used = Counter(int(n) for n in re.findall(r"\d+", equation))
        if any(used[n] > Counter(nums)[n] for n in used):
            scores.append(0.0)  # a number used more often than given
            continue
        try:
            value = _evaluate(ast.parse(equation, mode="eval"))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            scores.append(0.0)
            continue
        scores.append(1.0 if abs(value - goal) < 1e-9 else 0.0)
    return scores


def make_data(path: str, n: int = 2000, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            nums = [rng.randint(1, 20) for _ in range(4)]
            a, b, c = nums[:3]
            target = rng.choice([a + b + c, a * b - c, (a + b) * c, a * b + c])
            f.write(json.dumps({"numbers": nums, "target": target}) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-data":
        make_data(sys.argv[2])
        print(f"wrote {sys.argv[2]}")
    else:
        print("usage: python examples/custom_reward.py --make-data OUT.jsonl")
