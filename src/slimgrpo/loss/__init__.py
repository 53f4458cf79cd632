"""slimgrpo.loss: chunked LM-head log-probs and the GRPO-family objectives.

Two halves kept apart: ``logprobs`` turns a model and token ids into per-token log-probs without
materialising logits, and ``objectives`` turns log-probs and advantages into a scalar loss.
"""

from slimgrpo.loss.logprobs import (
    HeadSpec,
    auto_token_chunk,
    chunked_token_logprobs,
    completion_logprobs,
    completion_position_ids,
    lm_head_spec,
    naive_token_logprobs,
    unwrap_causal_lm,
)
from slimgrpo.loss.objectives import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LossSettings,
    Normaliser,
    clipped_surrogate,
    grpo_loss,
    k3_kl,
    sequence_log_ratio,
    token_log_ratio,
)

__all__ = [
    "HeadSpec",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LossSettings",
    "Normaliser",
    "auto_token_chunk",
    "chunked_token_logprobs",
    "clipped_surrogate",
    "completion_logprobs",
    "completion_position_ids",
    "grpo_loss",
    "k3_kl",
    "lm_head_spec",
    "naive_token_logprobs",
    "sequence_log_ratio",
    "token_log_ratio",
    "unwrap_causal_lm",
]
