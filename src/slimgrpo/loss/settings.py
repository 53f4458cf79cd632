"""``LossSettings`` from the config tree (the loss section plus the completion length of dr_grpo)."""

from __future__ import annotations

from slimgrpo.loss.objectives import LossSettings

# Fields of ``LossSettings`` read unchanged from ``cfg.loss`` (same name, same meaning).
_SAME_NAME = (
    "loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "beta",
    "use_bias_correction_kl", "sapo_temperature_pos", "sapo_temperature_neg", "vespo_k_pos",
    "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "off_policy_mask_threshold",
    "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy",
)


def loss_settings(cfg) -> LossSettings:
    """The objective of ``cfg`` (a ``slimgrpo.config.Config``)."""
    return LossSettings(**{k: getattr(cfg.loss, k) for k in _SAME_NAME},
                        max_completion_length=cfg.rollout.max_completion_length)
