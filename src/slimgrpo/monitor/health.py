"""Is the policy still learning? A check of each step's metrics for a collapsed policy.

A learning rate far too high (``optim.learning_rate=1e30``) can wreck the weights while keeping them
finite: after one update they sit around 1e30, every token becomes equally likely (entropy at its ceiling,
log of the vocabulary size), the reward falls to its floor, the advantages are all zero and the gradient
norm is 0.000 for every later step. Nothing is NaN, so the non-finite guard never fires; this check does.

A step counts as collapsed when all three hold:

- the gradient vanished (norm <= ``grad_norm_min``) or blew up (norm >= ``grad_norm_max``);
- the token entropy is at its ceiling (>= ``entropy_ratio`` x log(vocab_size));
- the mean reward is at the lowest value of the run so far and below the best one (it fell).

The last condition keeps a random-init model (whose entropy starts at the ceiling) with a constant reward
from counting as collapsed: its reward never fell. Skipped (non-finite) steps are the non-finite guard's
business and leave the streak as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass(frozen=True)
class HealthLimits:
    vocab_size: int
    max_collapsed_steps: int = 3  # 0 = never stop
    entropy_ratio: float = 0.95
    grad_norm_min: float = 1e-8
    grad_norm_max: float = 1e4

    @property
    def entropy_ceiling(self) -> float:
        """The entropy of a uniform distribution over the vocabulary (nats)."""
        return math.log(max(self.vocab_size, 2))


def _number(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def collapse_reason(metrics: dict[str, Any], best_reward: float | None, worst_reward: float | None,
                    limits: HealthLimits) -> str | None:
    """Why this step's metrics look like a collapsed policy (one phrase), or None when they do not.

    ``best_reward`` / ``worst_reward``: the highest and lowest mean reward of the earlier steps."""
    grad, entropy, reward = (_number(metrics, k) for k in ("grad_norm", "entropy", "reward"))
    if grad is None or entropy is None or reward is None or best_reward is None or worst_reward is None:
        return None
    vanished, exploded = grad <= limits.grad_norm_min, grad >= limits.grad_norm_max
    at_ceiling = entropy >= limits.entropy_ratio * limits.entropy_ceiling
    tolerance = 1e-6 * max(1.0, abs(best_reward))
    at_floor = reward <= worst_reward + tolerance and reward < best_reward - tolerance
    if not ((vanished or exploded) and at_ceiling and at_floor):
        return None
    return (f"gradient norm {grad:.3g} ({'vanished' if vanished else 'blew up'}), token entropy {entropy:.3f} = "
            f"{entropy / limits.entropy_ceiling:.0%} of its ceiling log({limits.vocab_size}) = "
            f"{limits.entropy_ceiling:.3f} (sampling is near-uniform), reward {reward:.3f} at its lowest "
            f"(best {best_reward:.3f})")


@dataclass
class HealthMonitor:
    """Feeds each step's metrics to :func:`collapse_reason`, counting collapsed steps in a row."""

    limits: HealthLimits
    streak: int = 0
    first_collapsed_step: int | None = None  # the first step of the current streak
    last_reason: str = ""
    _rewards: list[float] = field(default_factory=list)  # [lowest, highest] mean reward of earlier steps

    def observe(self, step: int, metrics: dict[str, Any]) -> str | None:
        """Record step ``step``; returns the reason when it looks collapsed, else None."""
        if metrics.get("update_skipped"):
            return None
        best, worst = (max(self._rewards), min(self._rewards)) if self._rewards else (None, None)
        reason = collapse_reason(metrics, best, worst, self.limits)
        reward = _number(metrics, "reward")
        if reward is not None:
            self._rewards = [min([reward, *self._rewards]), max([reward, *self._rewards])]
        if reason is None:
            self.streak, self.first_collapsed_step = 0, None
            return None
        self.streak += 1
        self.first_collapsed_step = self.first_collapsed_step or step
        self.last_reason = reason
        return reason

    def remember_rewards(self, history: Iterable[dict[str, Any]]) -> None:
        """A resumed run: the rewards of the steps before the checkpoint count as earlier steps."""
        rewards = [r for r in (_number(m, "reward") for m in history) if r is not None] + self._rewards
        self._rewards = [min(rewards), max(rewards)] if rewards else []

    @property
    def in_streak(self) -> bool:
        """Collapsed steps in a row that will stop the run if it goes on (0 = only warn: never)."""
        return self.streak > 0 and self.limits.max_collapsed_steps > 0

    @property
    def should_stop(self) -> bool:
        return 0 < self.limits.max_collapsed_steps <= self.streak


def collapse_streaks(history: Iterable[dict[str, Any]], limits: HealthLimits) -> list[int]:
    """The streak after each step of ``history`` (metric dicts in step order): for tests and reports."""
    monitor = HealthMonitor(limits)
    out = []
    for i, metrics in enumerate(history, start=1):
        monitor.observe(i, metrics)
        out.append(monitor.streak)
    return out


def collapse_diagnosis(monitor: HealthMonitor, step: int, output_dir, learning_rate: float,
                       at_end: bool = False) -> str:
    """The message that stops a run whose policy collapsed. Checkpoint N holds the weights that sampled
    step N+1's rollouts, so with the first collapsed step s, checkpoints from step s-1 on are suspect."""
    from slimgrpo.checkpoint import format as ckpt

    first = monitor.first_collapsed_step or step
    complete = [p for p in ckpt.list_complete(ckpt.checkpoint_dir(output_dir)) if ckpt.is_valid(p)]
    healthy = [p for p in complete if ckpt.checkpoint_step(p) <= first - 2]
    suspect = [p.name for p in complete if p not in healthy]
    after = (f" ({', '.join(suspect)} {'holds' if len(suspect) == 1 else 'hold'} weights that already sampled "
             "collapsed rollouts)" if suspect else "")
    if healthy:
        where = (f"The last healthy checkpoint is {healthy[-1]} (step {ckpt.checkpoint_step(healthy[-1])}): "
                 f"resume from it with a lower rate: run.resume={healthy[-1]} optim.learning_rate=...{after}.")
    else:
        where = (f"No checkpoint from before the collapse exists{after}: start afresh with a lower rate "
                 "(run.resume=never run.overwrite=true moves this run aside).")
    what = (f"the run ended at step {step} with its last {monitor.streak} step(s) collapsed"
            if at_end else f"stopped at step {step}: the policy collapsed for {monitor.streak} consecutive steps "
                           f"(run.max_collapsed_steps={monitor.limits.max_collapsed_steps})")
    from slimgrpo.config.sections.optim import OptimConfig

    default = OptimConfig().learning_rate
    if learning_rate > 10 * default:
        cause = (f"Likely cause: the learning rate, optim.learning_rate={learning_rate:g}, is far too high (the "
                 f"default is {default:g}).")
    else:  # not the rate: say what else makes every completion alike
        cause = (f"The learning rate (optim.learning_rate={learning_rate:g}) is not high; look at the rewards (one "
                 "that pays a single short answer drives the policy there) and at rollout.temperature.")
    return (f"{what}, first at step {first}: {monitor.last_reason}. The weights are finite but no longer learn, "
            f"so no final model was saved. {cause} {where}")


def monitor_for(cfg, model) -> HealthMonitor:
    """The monitor of a run: thresholds from ``run.*``, the vocabulary size from the model."""
    from slimgrpo.causal_lm import unwrap_causal_lm

    r = cfg.run
    limits = HealthLimits(vocab_size=int(unwrap_causal_lm(model).config.vocab_size),
                          max_collapsed_steps=r.max_collapsed_steps, entropy_ratio=r.collapse_entropy_ratio,
                          grad_norm_min=r.collapse_grad_norm_min, grad_norm_max=r.collapse_grad_norm_max)
    return HealthMonitor(limits)
