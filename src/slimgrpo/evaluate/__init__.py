"""Held-out evaluation: accuracy and unbiased pass@k with the run's reward functions.

``evaluate`` (here) is what ``slimgrpo eval`` (commands/eval.py) and evaluation during training
(evaluate/during.py) both call; importing this package does not load the command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from slimgrpo.data import PromptDataset
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.rollout.sampling import SamplingParams


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, arXiv:2107.03374):
    1 - C(n - c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


@dataclass
class EvalResult:
    accuracy: float  # fraction of completions scored >= success_threshold by the first reward function
    mean_reward: float  # mean weighted total reward
    pass_at: dict[int, float]  # k -> unbiased pass@k
    per_function: dict[str, float]  # mean score of each reward function
    num_prompts: int
    num_samples: int
    # The completions of the first ``keep_prompts`` prompts: {"prompt", "answer" (when the data has one),
    # "correct" (of num_samples), "completions": [{"text", "score", "correct", "rewards": {function: score}}]}
    samples: list[dict[str, Any]] = field(default_factory=list)
    # Standard error over prompts of "accuracy" and "mean_reward": std of the per-prompt means / sqrt(prompts)
    stderr: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy, "mean_reward": self.mean_reward,
            **{f"pass@{k}": v for k, v in self.pass_at.items()},
            **{f"rewards/{n}": v for n, v in self.per_function.items()},
            "num_prompts": self.num_prompts, "num_samples": self.num_samples,
        }


@dataclass(frozen=True)
class EvalSettings:
    """How ``evaluate`` samples and scores: ``num_samples`` completions per prompt with ``sampling``, pass@k for
    each k of ``ks`` (k <= num_samples), ``prompts_per_batch`` prompts per generate call, the sampling seed, the
    first reward's score that counts as correct (``success_threshold``), the completions of the first
    ``keep_prompts`` prompts kept in ``EvalResult.samples`` (so an accuracy can be read against what the model
    wrote), and the prompts to evaluate (``indices``; None: all)."""

    sampling: SamplingParams
    num_samples: int = 1
    ks: tuple[int, ...] = (1,)
    prompts_per_batch: int = 32
    seed: int = 0
    success_threshold: float = 1.0
    keep_prompts: int = 0
    indices: tuple[int, ...] | None = None


def evaluate(model, tokenizer, dataset: PromptDataset, reward_runner, settings: EvalSettings, engine=None,
             agent=None) -> EvalResult:
    """Sample ``settings.num_samples`` completions for every prompt (or the prompts at ``settings.indices``) and
    score them. ``engine``: a rollout engine to reuse (the trainer's, which knows how to gather sharded weights).
    ``agent``: the multi-turn rollout of ``rollout.tools`` / ``rollout.environment`` (an ``AgentRollout``):
    completions are then its conversations, scored as in training."""
    num_samples, sampling, keep_prompts = settings.num_samples, settings.sampling, settings.keep_prompts
    prompts_per_batch, indices = settings.prompts_per_batch, settings.indices
    engine = engine or TorchRolloutEngine(model)
    order = list(range(len(dataset))) if indices is None else list(indices)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(settings.seed)
    correct_per_prompt: list[int] = []
    reward_per_prompt: list[float] = []
    totals: list[float] = []
    per_fn: dict[str, list[float]] = {}
    samples: list[dict[str, Any]] = []
    for start in range(0, len(order), prompts_per_batch):
        batch = dataset.batch(order[start : start + prompts_per_batch])
        if agent is not None:
            rollout = agent.generate(batch, num_samples, sampling, gen)
        else:
            rollout = engine.generate(batch.prompt_ids, num_samples, sampling, gen)
        lengths = rollout.completion_lengths
        texts = [tokenizer.decode(r[: int(n)].tolist(), skip_special_tokens=True)
                 for r, n in zip(rollout.completion_ids, lengths)]
        completions = [[{"role": "assistant", "content": t}] if not isinstance(batch.prompts[i // num_samples], str)
                       else t for i, t in enumerate(texts)]
        if rollout.conversations is not None:  # multi-turn: the messages after the prompt, as in training
            completions = rollout.conversations
        prompts = [p for p in batch.prompts for _ in range(num_samples)]
        columns = {k: [v for v in vals for _ in range(num_samples)] for k, vals in batch.columns.items()}
        columns.update(rollout.reward_columns)  # e.g. TRL's ``environments`` for get_reward
        ids = [r[: int(n)].tolist() for r, n in zip(rollout.completion_ids, lengths)]
        out = reward_runner.score(prompts, completions, ids, columns)
        first = torch.nan_to_num(out.per_function[:, 0], nan=0.0)
        ok = (first >= settings.success_threshold - 1e-6).view(-1, num_samples)
        correct_per_prompt += ok.sum(dim=1).tolist()
        reward_per_prompt += torch.nan_to_num(out.total, nan=0.0).view(-1, num_samples).mean(dim=1).tolist()
        totals += torch.nan_to_num(out.total, nan=0.0).tolist()
        for j, name in enumerate(out.names):
            col = out.per_function[:, j]
            per_fn.setdefault(name, []).extend(col[~torch.isnan(col)].tolist())
        for p in range(min(len(batch.prompts), keep_prompts - len(samples))):
            samples.append(_kept(p, num_samples, batch, texts, out, ok, completions, rollout.conversations))
    n_prompts = len(correct_per_prompt)
    accuracy = sum(correct_per_prompt) / max(n_prompts * num_samples, 1)
    return EvalResult(
        accuracy=accuracy,
        mean_reward=sum(totals) / max(len(totals), 1),
        pass_at={k: sum(pass_at_k(num_samples, c, k) for c in correct_per_prompt) / max(n_prompts, 1)
                 for k in settings.ks if k <= num_samples},
        per_function={n: (sum(v) / len(v) if v else float("nan")) for n, v in per_fn.items()},
        num_prompts=n_prompts,
        num_samples=num_samples,
        samples=samples,
        stderr={"accuracy": standard_error([c / num_samples for c in correct_per_prompt]),
                "mean_reward": standard_error(reward_per_prompt)},
    )


def _kept(p: int, n: int, batch, texts, out, ok, completions, conversations) -> dict[str, Any]:
    """Prompt ``p`` of a batch with its ``n`` completions, scores and rewards (plain JSON values)."""
    rows = range(p * n, (p + 1) * n)
    kept: dict[str, Any] = {"prompt": batch.prompts[p]}
    if "answer" in batch.columns:
        kept["answer"] = batch.columns["answer"][p]
    kept["correct"] = int(ok[p].sum())
    kept["completions"] = [{
        "text": completions[i] if conversations is not None else texts[i],
        "score": _number(out.per_function[i, 0]),
        "correct": bool(ok[p, i - p * n]),
        "rewards": {name: _number(out.per_function[i, j]) for j, name in enumerate(out.names)},
    } for i in rows]
    return kept


def _number(value) -> float | None:
    v = float(value)
    return None if math.isnan(v) else v


def standard_error(values: list[float]) -> float:
    """Standard error of the mean (sample std / sqrt(n)); NaN with fewer than two values."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
