"""slimgrpo.loss: the chunked LM head and the GRPO-family objectives, pure tensor functions (no model runs here:
``slimgrpo.forward`` takes a model's rows to the hidden states these take).

- ``chunked_head``: per-token log-probs (and entropy) of hidden states through the LM head, chunk by chunk, with
  its backward, so that ``[rows, tokens, vocab]`` logits never exist; ``fused``: the head and a separable
  objective in one pass;
- ``objectives``: log-probs and advantages to a scalar loss (``grpo_loss``, every ``loss_type``), with the
  per-token policy terms and the token masks in ``policy_losses``; ``entropy_control``: the adaptive entropy
  bonus's coefficient; ``settings``: ``LossSettings`` from the config;
- ``costs``: what the head and the loss hold (the planner's loss line).
"""

from slimgrpo.config.sections.loss import auto_token_chunk
from slimgrpo.loss.chunked_head import HeadSpec, chunked_token_logprobs
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
    "entropy_threshold",
    "grpo_loss",
    "high_entropy_mask",
    "k3_kl",
    "kl_weight",
    "off_policy_keep",
    "sapo_term",
    "sequence_log_ratio",
    "token_log_ratio",
    "vespo_term",
    "vespo_weights",
]
