"""The objective section: loss type, clipping, KL, advantages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class LossConfig:
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo"] = "dapo"
    """Aggregation: grpo = mean per sequence then over sequences; bnpo = mean over the batch's tokens;
    dr_grpo = sum / (sequences x max_completion_length); dapo = mean over all tokens of the global batch;
    cispo (MiniMax-M1) = capped, detached ratio times A log p; sapo = soft sigmoid gate instead of the clip;
    vespo = gamma-weighted sequence ratio; luspo = GSPO with each sequence weighted by its length (docs/loss.md)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to the reference policy (0 = no reference model at all)."""
    epsilon: float = 0.2
    """Lower clipping bound: ratios below 1 - epsilon are clipped."""
    epsilon_high: float | None = None
    """Upper clipping bound (clip-higher, DAPO); None = epsilon."""
    delta: float | None = None
    """Two-sided clipping: cap the unclipped ratio at delta (INTELLECT-2); None = off."""
    use_bias_correction_kl: bool = True
    """Multiply the KL term by the importance ratio (DeepSeek-V3.2; TRL 1.16's default). Changes the KL
    gradient whenever beta > 0, on-policy too."""
    sapo_temperature_pos: float = 1.0
    """sapo: gate temperature for positive advantages."""
    sapo_temperature_neg: float = 1.05
    """sapo: gate temperature for zero or negative advantages."""
    vespo_k_pos: float = 2.0
    """vespo: power k of the gamma weight for advantages >= 0."""
    vespo_lambda_pos: float = 3.0
    """vespo: decay lambda of the gamma weight for advantages >= 0."""
    vespo_k_neg: float = 3.0
    """vespo: power k of the gamma weight for negative advantages."""
    vespo_lambda_neg: float = 2.0
    """vespo: decay lambda of the gamma weight for negative advantages."""
    off_policy_mask_threshold: float | None = None
    """Drop from the policy loss sequences with a negative advantage whose mean (old - new) log-prob exceeds
    this (DeepSeek-V3.2, e.g. 0.5); None = off."""
    top_entropy_quantile: float = 1.0
    """Keep the policy loss only on this top fraction of tokens by entropy (0.2 in "Beyond the 80/20 rule";
    0 = only the highest-entropy token, 1 = all)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus: the loss minus entropy_coef x the mean per-token entropy of the policy
    over the tokens the policy term acts on (a plain mean over the whole batch, whatever loss_type; TRL's
    entropy_coef). 0 = off; the initial value with use_adaptive_entropy."""
    use_adaptive_entropy: bool = False
    """Skywork-OR1 adaptive entropy control: after each optimizer step entropy_coef grows by
    entropy_coef_delta if that step's mean entropy was <= entropy_target, else shrinks by it (within
    [entropy_coef_min, entropy_coef_max]); the bonus applies only while the last entropy is <= the target."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive entropy coefficient."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive entropy coefficient."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive entropy coefficient per optimizer step."""
    entropy_target: float = 0.2
    """Target mean per-token entropy (nats) of adaptive control, over the same tokens as the policy term.
    Language models usually sit at 2-10 nats, so 0.2 acts only on near-collapse: set it near the entropy
    you want to keep."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the reward std of the group, of the whole batch, or not at all."""
    advantage_estimator: Literal["grpo", "rloo", "gae"] = "grpo"
    """``grpo``: reward minus group mean; ``rloo``: reward minus mean of the other completions; ``gae``: PPO,
    per-token advantages GAE(gamma, lam) from a learned critic (the ``critic`` section; docs/ppo.md)."""
    kl_coef: float = 0.05
    """gae (PPO) only: the KL to the reference as a per-token reward penalty, -kl_coef * (logp_old - logp_ref)
    on every completion token (classic RLHF, TRL PPOConfig's kl_coef). 0 = none; the KL can also (or instead)
    go into the loss as GRPO does, with beta."""
    gamma: float = 1.0
    """gae (PPO) only: discount per completion token (TRL's gamma)."""
    lam: float = 0.95
    """gae (PPO) only: GAE's lambda, the bias-variance trade-off of the advantage (TRL's lam)."""
    whiten_rewards: bool = False
    """gae (PPO) only: scale the per-token rewards to unit variance over the batch (mean kept) before GAE
    (TRL's whiten_rewards)."""
    whiten_advantages: bool = True
    """gae (PPO) only: normalise the GAE advantages to mean 0, variance 1 over the batch's tokens (TRL always
    does)."""
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """How several reward functions combine: weighted sum then group advantages, or (GDPO) normalise each
    function within its group, sum with the weights, then normalise over the batch."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``max_completion_length`` out of the loss."""
    num_iterations: int = 1
    """Optimizer steps per generated batch (mu in the GRPO paper); > 1 keeps old log-probs. With PPO (gae)
    this is TRL's num_ppo_epochs: passes over one rollout."""
    steps_per_generation: int = 1
    """Split each generated batch (run.batch_size completions) into this many slices, one optimizer step each
    (TRL's steps_per_generation); old log-probs are then taken once after generation. With num_iterations,
    every slice is revisited num_iterations times. With PPO (gae) this is TRL's num_mini_batches."""
    sync_ref_model: bool = False
    """TR-DPO reference updates: every ref_model_sync_steps optimizer steps, ref = alpha * policy +
    (1 - alpha) * ref. Full fine-tuning with beta > 0 only (the LoRA reference is the base model itself)."""
    ref_model_mixup_alpha: float = 0.6
    """alpha of sync_ref_model."""
    ref_model_sync_steps: int = 512
    """Optimizer steps between reference updates (sync_ref_model)."""
    token_chunk: int | None = None
    """Tokens pushed through the LM head at once when computing log-probs (full logits never exist).
    None = auto: the largest power of two whose fp32 logits chunk stays under 64 MiB (64 tokens for a
    152K vocabulary)."""
    vocab_chunk: int | None = None
    """Also split the vocabulary into chunks of this size (online log-sum-exp); None = whole vocab."""
    fuse_head_loss: bool = True
    """Form the loss gradient inside the chunked LM-head pass (one fewer head product per chunk) when the
    objective allows it (token-level ratios, or no old log-probs; no ``vocab_chunk``); gradients are equal."""

    @property
    def entropy_bonus(self) -> bool:
        """The entropy bonus is part of the objective (TRL: a non-zero coefficient, or adaptive control, where a
        coefficient decremented to 0 can come back); ``loss.objectives.LossSettings`` and the planner ask this."""
        return entropy_bonus_on(self.entropy_coef, self.use_adaptive_entropy)


def entropy_bonus_on(entropy_coef: float, use_adaptive_entropy: bool) -> bool:
    return entropy_coef != 0.0 or use_adaptive_entropy


LOGITS_CHUNK_BYTES = 64 * 2**20  # the fp32 [token_chunk, vocab slice] logits block that loss.token_chunk=None aims at
MIN_TOKEN_CHUNK, MAX_TOKEN_CHUNK = 16, 4096


def auto_token_chunk(vocab_size: int, vocab_chunk: int | None = None) -> int:
    """The default ``loss.token_chunk``, for training and the library alike: the largest power of two of
    tokens whose fp32 logits block ``[tokens, min(vocab_chunk, V)]`` fits ``LOGITS_CHUNK_BYTES`` (64 MiB),
    between 16 and 4096. E.g. 64 tokens for V = 151,936 (Qwen2), 512 for V = 32,000 (Llama 2). The peak
    working set of the chunked head is two such blocks (three with softcap), whatever the batch size."""
    width = vocab_size if vocab_chunk is None else min(vocab_chunk, vocab_size)
    tokens = max(LOGITS_CHUNK_BYTES // (4 * max(width, 1)), 1)
    return int(min(max(2 ** (tokens.bit_length() - 1), MIN_TOKEN_CHUNK), MAX_TOKEN_CHUNK))


LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")  # LossConfig.loss_type's
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")  # LossConfig.importance_sampling_level's


def fused_applicable(importance_sampling_level: str, has_old_logp: bool, vocab_chunk: int | None) -> bool:
    """Whether loss/fused.py's fused path is expected to be separable (else the caller keeps the separate path).

    Token-level ratios are separable; the sequence ratio is too at the on-policy point (its value is 1
    whatever the log-probs) but not with old log-probs.  Vocabulary chunks need two passes over the
    logits (the log-sum-exp before the softmax), which the fused pass cannot save.
    """
    if vocab_chunk is not None:
        return False
    return importance_sampling_level == "token" or not has_old_logp


def takes_fused_path(fuse: bool, top_entropy_quantile: float, entropy_grad: bool, importance_sampling_level: str,
                     has_old_logp: bool, vocab_chunk: int | None) -> bool:
    """Whether a micro-batch's loss runs through the fused head of loss/fused.py (``update.micro_loss``'s
    choice, and the planner's: the two paths hold different working sets). ``fuse``: ``loss.fuse_head_loss``;
    the top-entropy mask (``top_entropy_quantile < 1``) needs every token's entropy before the loss and the
    entropy bonus (``entropy_grad``) its gradient, which only the separate path gives; then
    ``fused_applicable``."""
    return (fuse and top_entropy_quantile >= 1.0 and not entropy_grad
            and fused_applicable(importance_sampling_level, has_old_logp, vocab_chunk))


def objective_problem(x, max_completion_length: int | None) -> tuple[str, str] | None:
    """The one range check of the objective's fields: ``(field, what is wrong)`` for the first one out of
    range in ``x`` (a ``LossConfig``, or the loss's ``LossSettings``), or None. ``max_completion_length``:
    dr_grpo's divisor (``rollout.max_completion_length`` in the config)."""
    if x.loss_type not in LOSS_TYPES:
        return "loss_type", f"must be one of {LOSS_TYPES}, got {x.loss_type!r}"
    if x.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        return ("importance_sampling_level",
                f"must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {x.importance_sampling_level!r}")
    if not 0.0 < x.epsilon < 1.0:
        return "epsilon", f"must be in (0, 1) (TRL: 0.2), got {x.epsilon}"
    if x.epsilon_high is not None and not x.epsilon_high > 0.0:
        return "epsilon_high", f"must be > 0 or null (= epsilon), got {x.epsilon_high}"
    if x.delta is not None and not x.delta > 1.0:
        return "delta", (f"caps the ratio from above and must be > 1 (INTELLECT-2 uses 4; keep it above "
                         f"1 + epsilon_high), got {x.delta}")
    if not x.beta >= 0.0:
        return "beta", f"must be >= 0, got {x.beta}"
    if max_completion_length is not None and max_completion_length < 1:
        return "max_completion_length", f"must be >= 1, got {max_completion_length}"
    if x.loss_type == "dr_grpo" and max_completion_length is None:
        return "max_completion_length", "must be set for loss_type='dr_grpo', which divides by it"
    for name in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        if not getattr(x, name) > 0.0:
            return name, f"must be > 0, got {getattr(x, name)}"
    for name in ("vespo_k_pos", "vespo_k_neg"):
        if not getattr(x, name) >= 0.0:
            return name, f"must be >= 0, got {getattr(x, name)}"
    if x.off_policy_mask_threshold is not None and not x.off_policy_mask_threshold > 0:
        return ("off_policy_mask_threshold",
                f"must be > 0 (DeepSeek-V3.2 uses e.g. 0.5) or null (off), got {x.off_policy_mask_threshold}")
    if not 0.0 <= x.top_entropy_quantile <= 1.0:
        return ("top_entropy_quantile",
                f"must be in [0, 1] (1 = every token, 0.2 as in the paper), got {x.top_entropy_quantile}")
    return None
