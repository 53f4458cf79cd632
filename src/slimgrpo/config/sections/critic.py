"""The critic section: PPO's learned value function (``loss.advantage_estimator: gae``, docs/ppo.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CriticConfig:
    model_path: str | None = None
    """Full fine-tuning only: the model the critic's backbone is loaded from (a second model, with its own
    gradients and optimizer state: the planner counts it); None = model.path. From Python it may also be a
    loaded sequence-classification model (``slimgrpo.trl.PPOTrainer``'s ``value_model``): its decoder is the
    backbone and its ``score`` head the value head. With LoRA the critic is a second adapter (same lora.*
    settings) plus a value head on the policy's frozen base: no second copy."""
    vf_coef: float = 0.1
    """Weight of the value loss next to the policy loss (TRL's vf_coef); both share one optimizer and one
    gradient-norm clip, as in TRL."""
    cliprange_value: float = 0.2
    """Clip the critic's new values to within this distance of its values at sampling time in the value loss
    (PPO2; TRL's cliprange_value)."""
