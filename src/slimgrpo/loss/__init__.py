"""slimgrpo.loss: chunked LM-head log-probs and the GRPO-family objectives.

Two halves kept apart: ``logprobs`` turns a model and token ids into per-token log-probs without
materialising logits, and ``objectives`` turns log-probs and advantages into a scalar loss (with the
per-token policy terms of each loss type and the token masks in ``policy_losses``).
"""

from slimgrpo.loss.logprobs import (
    HeadSpec,
    auto_token_chunk,
    chunked_token_logprobs,
    completion_logprobs,
    completion_position_ids,
    lm_head_spec,
)
from slimgrpo.loss.objectives import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LossSettings,
    Normaliser,
    PolicyObjective,
    TokenEntropy,
    grpo_loss,
    k3_kl,
    kl_weight,
    sequence_log_ratio,
    token_log_ratio,
)
from slimgrpo.loss.policy_losses import (
    cispo_term,
    clipped_surrogate,
    entropy_threshold,
    high_entropy_mask,
    off_policy_keep,
    sapo_term,
    vespo_term,
    vespo_weights,
)

__all__ = [
    "HeadSpec",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LossSettings",
    "Normaliser",
    "PolicyObjective",
    "TokenEntropy",
    "auto_token_chunk",
    "chunked_token_logprobs",
    "cispo_term",
    "clipped_surrogate",
    "completion_logprobs",
    "completion_position_ids",
    "entropy_threshold",
    "grpo_loss",
    "high_entropy_mask",
    "k3_kl",
    "kl_weight",
    "lm_head_spec",
    "off_policy_keep",
    "sapo_term",
    "sequence_log_ratio",
    "token_log_ratio",
    "vespo_term",
    "vespo_weights",
]
