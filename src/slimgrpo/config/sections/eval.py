"""Evaluation during training: held-out prompts scored by the run's reward functions."""

from __future__ import annotations

from dataclasses import dataclass

from slimgrpo.config.errors import ConfigError


@dataclass
class EvalConfig:
    data: str = ""
    """Held-out prompts file, in the same formats and columns as ``data.path`` (empty = no evaluation).
    Evaluated before the first step, every ``eval.steps`` steps and at the end; the results go to
    metrics.jsonl as ``eval/accuracy_greedy``, ``eval/accuracy_sampled``, ``eval/pass@<k>``, ``eval/mean_reward``
    and ``eval/rewards/<function>``, and to every ``log.report_to`` backend."""
    steps: int = 0
    """Evaluate every N optimizer steps (0 = only before the first step and at the end)."""
    num_samples: int = 4
    """Sampled completions per prompt for sampled accuracy and the unbiased pass@k (k = num_samples)."""
    max_prompts: int | None = 200
    """Evaluate the first N prompts of ``eval.data`` (None = all of them)."""
    temperature: float | None = None
    """Temperature of the sampled completions (None = ``rollout.temperature``). Greedy accuracy always
    decodes with temperature 0 and one completion per prompt."""
    threshold: float = 1.0
    """A completion counts as correct when the FIRST reward function in ``rewards.functions`` scores it at
    least this high (list the correctness reward first); ``eval/mean_reward`` is the weighted total."""


def validate_eval(cfg) -> None:
    e = cfg.eval
    if e.steps < 0:
        raise ConfigError(f"eval.steps must be >= 0 (0 = only before and after training), got {e.steps}")
    if e.num_samples < 1:
        raise ConfigError(f"eval.num_samples must be >= 1, got {e.num_samples}")
    if e.max_prompts is not None and e.max_prompts < 1:
        raise ConfigError(f"eval.max_prompts must be >= 1 or null (all prompts), got {e.max_prompts}")
    if e.temperature is not None and e.temperature < 0:
        raise ConfigError(f"eval.temperature must be >= 0, got {e.temperature}")
