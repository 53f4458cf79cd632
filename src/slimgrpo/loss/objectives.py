"""The GRPO family of policy-gradient objectives, as small pure tensor functions.

For completion ``i`` with tokens ``t`` (mask ``m_it``, length ``|o_i| = sum_t m_it``), policy
log-probs ``logp_it``, sampling-time ("old") log-probs ``old_it``, reference log-probs ``ref_it``
and advantage ``A_i`` (group-normalised rewards, or RLOO leave-one-out baselines, Ahmadian et al.
arXiv:2402.14740; computed by ``slimgrpo.advantage.estimators``)::

    token ratio     r_it = exp(logp_it - old_it)                       GRPO, arXiv:2402.03300
    sequence ratio  s_i  = exp(sum_t m_it (logp_it - old_it) / |o_i|)   GSPO, arXiv:2507.18071
    surrogate       l_it = -min(c_it A_i, clip(r_it, 1 - eps, 1 + eps_high) A_i)
                    c_it = r_it, or min(r_it, delta) with the two-sided cap of INTELLECT-2
                           (arXiv:2505.07291), which bounds the loss of negative-advantage tokens
                    eps_high > eps is DAPO's "clip-higher" (arXiv:2503.14476)
    other policy terms (cispo, sapo, vespo) and the token masks (off-policy sequences, top-entropy
                    tokens) that multiply l_it: see ``policy_losses``
    entropy bonus   L -= c * sum_it H_it e_it / sum_it e_it over the WHOLE batch (all micro-batches and
                           ranks), H_it the policy's per-token entropy (with gradient), e_it = m_it times
                           the top-entropy mask: the tokens the policy term acts on; c = ``entropy_coef``,
                           fixed or adapted per optimizer step (Skywork-OR1, arXiv:2505.22312; TRL 1.16's
                           ``entropy_coef`` / ``use_adaptive_entropy``): see ``entropy_bonus``
    KL penalty      l_it += beta * w_it * k3_it,  k3 = exp(ref - logp) - (ref - logp) - 1
                           (Schulman 2020, "Approximating KL divergence"; unbiased, >= 0)
                    w_it = r_it (token level) or s_i (sequence level, gradient through every token
                           of the row) when ``use_bias_correction_kl`` (TRL 1.16's default, DeepSeek-V3.2,
                           arXiv:2512.02556): the KL gradient becomes the unbiased reverse-KL gradient
                           under off-policy samples; it changes the gradient even on-policy, where
                           w = 1 in value but d w / d logp = w.  w_it = 1 otherwise.

PPO (``loss.advantage_estimator = gae``) uses the clipped surrogate with per-token advantages ``A_it``
(GAE from a learned critic, ``slimgrpo.advantage.estimators.gae``) and adds a critic trained on the clipped value
loss of PPO2 (TRL's PPOTrainer; ``value_loss``), with values ``v_it``, their values at sampling time
``v_old_it`` and returns ``R_it``::

    value loss      l^V_it = 0.5 * max((v_it - R_it)^2, (v_old_it + clip(v_it - v_old_it, -c, c) - R_it)^2)
                    L^V = vf_coef * sum_it l^V_it m_it / N.num_tokens,   c = ``cliprange_value``

The per-token losses are aggregated according to ``loss_type`` (``N`` = ``Normaliser``)::

    grpo, sapo       sum_i (sum_t l_it m_it / |o_i|) / N.num_sequences      arXiv:2402.03300
    bnpo             sum_it l_it m_it / N.num_tokens
    dapo, cispo,     sum_it l_it m_it / N.num_tokens  (token-level, arXiv:2503.14476)
      vespo
    dr_grpo          sum_it l_it m_it / (N.num_sequences * max_completion_length)  arXiv:2503.20783
    luspo            sum_it l_it m_it / N.num_sequences  (each sequence weighted by its length,
                                                          LUSPO, arXiv:2602.05261)

The trainer fills ``Normaliser.num_tokens`` with the tokens of the whole batch for token-mean types
(all ranks) and with this rank's tokens times the world size for ``bnpo`` (TRL's "local batch"); in
one process the two coincide.  Because the divisors are totals over the whole batch
(every micro-batch, every rank), summing micro-batch losses gives the batch loss exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

import slimgrpo.loss.policy_losses as terms
from slimgrpo.config.sections.loss import (IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, LossConfig, entropy_bonus_on,
                                          objective_problem)
from slimgrpo.containers import LossStats

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the clipped surrogate


_D = LossConfig()  # the defaults of the config's loss section: the one place they are written


class InvalidLossSetting(ValueError):
    """A ``LossSettings`` field out of range; ``key`` names the field (the config says ``loss.<key>``)."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key} {problem}")
        self.key, self.problem = key, problem


@dataclass(frozen=True)
class LossSettings:
    """Which member of the GRPO family to optimise (names and defaults follow TRL 1.16's ``GRPOConfig``).

    The defaults are the config's (``config.loss.LossConfig``) and the range check is the config's too
    (``config.loss.objective_problem``, which ``config.validate`` runs on every config, naming the key)."""

    loss_type: str = _D.loss_type  # how per-token losses are formed and averaged, see the module docstring
    importance_sampling_level: str = _D.importance_sampling_level  # "token" (GRPO) or "sequence" (GSPO)
    epsilon: float = _D.epsilon  # lower clip: ratios below 1 - epsilon stop pushing down
    epsilon_high: float | None = _D.epsilon_high  # upper clip 1 + epsilon_high; None: epsilon (DAPO: 0.28);
    # for cispo the cap eps_max on the ratio itself (ScaleRL: 5.0)
    delta: float | None = _D.delta  # cap on the unclipped ratio (INTELLECT-2); None means no cap
    beta: float = _D.beta  # weight of the k3 KL penalty to the reference policy; 0 needs no reference
    max_completion_length: int | None = None  # fixed divisor of dr_grpo (required for it)
    use_bias_correction_kl: bool = _D.use_bias_correction_kl  # KL term times the importance ratio (TRL 1.16)
    sapo_temperature_pos: float = _D.sapo_temperature_pos  # SAPO gate temperature for A > 0
    sapo_temperature_neg: float = _D.sapo_temperature_neg  # SAPO gate temperature for A <= 0
    vespo_k_pos: float = _D.vespo_k_pos  # VESPO exponent k for A >= 0
    vespo_lambda_pos: float = _D.vespo_lambda_pos  # VESPO decay lambda for A >= 0
    vespo_k_neg: float = _D.vespo_k_neg  # VESPO exponent k for A < 0
    vespo_lambda_neg: float = _D.vespo_lambda_neg  # VESPO decay lambda for A < 0
    off_policy_mask_threshold: float | None = _D.off_policy_mask_threshold  # DeepSeek-V3.2 sequence mask; None = off
    top_entropy_quantile: float = _D.top_entropy_quantile  # keep the policy term on this top fraction by entropy
    entropy_coef: float = _D.entropy_coef  # weight of the entropy bonus (initial value with use_adaptive_entropy)
    use_adaptive_entropy: bool = _D.use_adaptive_entropy  # Skywork-OR1 adaptive coefficient (``entropy_control``)

    def __post_init__(self) -> None:
        problem = objective_problem(self, self.max_completion_length)
        if problem is not None:
            raise InvalidLossSetting(*problem)

    @property
    def entropy_bonus(self) -> bool:
        """The bonus is part of the objective (``config.sections.loss.LossConfig.entropy_bonus``'s rule)."""
        return entropy_bonus_on(self.entropy_coef, self.use_adaptive_entropy)

    @property
    def upper_epsilon(self) -> float:
        """``epsilon_high``, defaulting to ``epsilon``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


@dataclass
class Normaliser:
    """Batch totals the loss divides by; set by the trainer for the WHOLE optimiser step.

    ``num_sequences`` counts completions and ``num_tokens`` masked completion tokens over all
    micro-batches (and all data-parallel ranks when gradients are summed across them), so that
    the micro-batch losses add up to the batch loss.
    """

    num_sequences: int
    num_tokens: int
    # Entropy bonus: the tokens its mean runs over, in the whole batch (all micro-batches and ranks); None:
    # each micro-batch's own count times ``entropy_parts`` (TRL's per-micro-batch mean, averaged).
    entropy_tokens: int | None = None
    entropy_parts: int = 1

    def __post_init__(self) -> None:
        if self.num_sequences < 1 or self.num_tokens < 1:
            raise ValueError(f"Normaliser needs at least one sequence and one token, got "
                             f"num_sequences={self.num_sequences}, num_tokens={self.num_tokens}")

    @classmethod
    def of(cls, mask: Tensor) -> Normaliser:
        """Totals of a single batch ``mask`` [rows, T] (no accumulation, one rank)."""
        return cls(num_sequences=int(mask.shape[0]), num_tokens=int(mask.sum()))


@dataclass(frozen=True)
class TokenEntropy:
    """The policy's per-token entropy as ``grpo_loss`` takes it, with what the loss does with it: the
    top-entropy mask (``top_entropy_quantile < 1``) and the entropy bonus (``LossSettings.entropy_bonus``)."""

    values: Tensor  # [rows, T]; no grad for the mask, with grad for a bonus whose coefficient is not 0
    # The entropy threshold of the whole batch (``policy_losses.entropy_threshold``); None computes it from
    # this micro-batch's tokens (TRL's behaviour, where it is taken per micro-batch).
    cut: Tensor | float | None = None
    # The bonus coefficient applied at this optimizer step (adaptive control); None: ``settings.entropy_coef``.
    coef: float | None = None


# --- importance ratios --------------------------------------------------------------------------


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``log r_it = logp_it - old_it`` -> [rows, T]."""
    del mask
    return logp - old_logp


def _row_mean_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """``sum_t m_it (logp_it - old_it) / |o_i|`` -> [rows], with gradient."""
    m = mask.to(logp.dtype)
    return ((logp - old_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token log-ratio: ``sg(log s_i) + logp_it - sg(logp_it)`` -> [rows, T].

    Its value is the sequence log-ratio ``log s_i = sum_t m_it (logp_it - old_it) / |o_i|`` on
    every token, and its gradient wrt ``logp_it`` is 1, so ``d s_it / d logp_it = s_i``
    (GSPO, arXiv:2507.18071, eq. for GSPO-token).  For any term ``f(s_i)`` summed over a row's
    tokens this gives the same gradient as the plain sequence ratio broadcast over the row (TRL).
    """
    seq = _row_mean_log_ratio(logp, old_logp, mask)  # [rows]
    return seq.detach()[:, None] + logp - logp.detach()


_LOG_RATIO: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


def kl_weight(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """The bias-correction weight of the KL term: ``r_it`` [rows, T] or ``s_i`` [rows, 1].

    At sequence level it is the plain sequence ratio, whose gradient reaches every token of the row
    (``d s_i / d logp_it = s_i / |o_i|``): the KL term is not a function of the ratio alone, so
    the GSPO-token form would give another gradient than TRL's broadcast product.
    """
    if level == "token":
        return torch.exp(logp - old_logp)
    return torch.exp(_row_mean_log_ratio(logp, old_logp, mask))[:, None]


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``k3 = exp(ref - logp) - (ref - logp) - 1``: unbiased, non-negative estimate of KL(pi||ref)."""
    diff = ref_logp - logp
    return torch.exp(diff) - diff - 1.0


# --- aggregation --------------------------------------------------------------------------------


def _sequence_mean(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    m = mask.to(loss.dtype)
    per_seq = (loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [rows]
    return per_seq.sum() / n.num_sequences


def _token_mean(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    return (loss * mask.to(loss.dtype)).sum() / n.num_tokens


def _constant_length(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    assert s.max_completion_length is not None  # LossSettings validates this for dr_grpo
    return (loss * mask.to(loss.dtype)).sum() / (n.num_sequences * s.max_completion_length)


def _sequence_sum(loss: Tensor, mask: Tensor, s: LossSettings, n: Normaliser) -> Tensor:
    return (loss * mask.to(loss.dtype)).sum() / n.num_sequences


_AGGREGATE: dict[str, Callable[[Tensor, Tensor, LossSettings, Normaliser], Tensor]] = {
    "grpo": _sequence_mean,
    "sapo": _sequence_mean,
    "bnpo": _token_mean,
    "dapo": _token_mean,
    "cispo": _token_mean,
    "vespo": _token_mean,
    "dr_grpo": _constant_length,
    "luspo": _sequence_sum,
}
assert set(_AGGREGATE) == set(LOSS_TYPES)


# --- the entropy bonus --------------------------------------------------------------------------


def entropy_bonus(entropy: Tensor, effective_mask: Tensor, coef: float, norm: Normaliser) -> Tensor:
    """The entropy term added to the loss: ``-c * sum_it H_it e_it / D`` (a scalar, gradient to ``entropy``).

    ``H`` [rows, T] the per-token entropy of the tempered policy, ``e`` [rows, T] the tokens the policy
    term acts on (completion mask times the top-entropy mask), ``c`` the coefficient applied at this
    optimizer step.  ``D = norm.entropy_tokens`` (the count of ``e`` over the whole batch, so micro-batch
    terms add up to ``-c * mean H``), else this micro-batch's count times ``norm.entropy_parts``.
    TRL 1.16 ``GRPOTrainer._compute_loss``: ``loss - coef * mean_e(H) / gradient_accumulation_steps``;
    the bonus is a plain mean whatever the loss type; Skywork-OR1 (He et al., arXiv:2505.22312) sec. 3.2.
    """
    m = effective_mask.to(entropy.dtype)
    if norm.entropy_tokens is not None:
        denom = float(max(norm.entropy_tokens, 1))
    else:
        denom = m.sum().clamp(min=1.0) * norm.entropy_parts
    return -coef * (entropy * m).sum() / denom


# --- the loss -----------------------------------------------------------------------------------


def _check_shapes(logp: Tensor, old_logp: Tensor | None, ref_logp: Tensor | None,
                  advantages: Tensor, mask: Tensor, beta: float) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [rows, T], got {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have logp's shape {tuple(logp.shape)}, "
                             f"got {tuple(t.shape)}")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(f"advantages must be [rows] = [{logp.shape[0]}] or [rows, T] = "
                         f"{list(logp.shape)}, got {tuple(advantages.shape)}")
    if beta > 0.0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (reference-policy log-probs)")


def _masked_means(values: list[Tensor], mask: Tensor) -> list[float]:
    """Masked means of several [rows, T] tensors with a single device-to-host copy."""
    m = mask.to(torch.float32)
    denom = m.sum().clamp(min=1.0)
    stacked = torch.stack([(v.detach().float() * m).sum() / denom for v in values])
    return stacked.tolist()


def policy_term(logp: Tensor, old: Tensor, ratio: Tensor, advantages: Tensor, mask: Tensor,
                s: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token policy loss of ``s.loss_type`` -> ([rows, T], per-type quantities for stats)."""
    if s.loss_type == "cispo":
        return terms.cispo_term(logp, ratio, advantages, s.upper_epsilon), {}
    if s.loss_type == "sapo":
        return terms.sapo_term(ratio, advantages, s.sapo_temperature_pos, s.sapo_temperature_neg), {}
    if s.loss_type == "vespo":
        phi = terms.vespo_weights(logp, old, mask, advantages, s.vespo_k_pos, s.vespo_lambda_pos,
                                  s.vespo_k_neg, s.vespo_lambda_neg)
        return terms.vespo_term(logp, phi, advantages), {"phi": phi}
    return terms.clipped_surrogate(ratio, advantages, s.epsilon, s.upper_epsilon, s.delta), {}


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings,
    norm: Normaliser,
    entropy: TokenEntropy | None = None,
) -> tuple[Tensor, LossStats]:
    """The GRPO-family loss of one micro-batch (module docstring for the equations).

    Args:
        logp: ``[rows, T]`` float32 log-probs of the completion tokens under the policy (grad).
        old_logp: ``[rows, T]`` log-probs at sampling time; None when the policy has not moved
            since sampling (one update per batch): the ratio is then 1 with the right gradient.
        ref_logp: ``[rows, T]`` reference-policy log-probs; needed only when ``beta > 0``.
        advantages: ``[rows]`` one advantage per completion.
        mask: ``[rows, T]`` bool, True on completion tokens that count.
        settings: the objective.
        norm: whole-batch totals, so that micro-batch losses sum to the batch loss.
        entropy: the per-token entropy of the policy (``TokenEntropy.values`` ``[rows, T]``), with the
            batch's entropy threshold and this step's bonus coefficient; needed when
            ``top_entropy_quantile < 1`` (no grad) or with the entropy bonus (``settings.entropy_bonus``;
            with grad where the coefficient is not 0).

    Returns:
        ``(loss, stats)``: a scalar whose gradient flows to ``logp``, and detached ``LossStats``
        (``kl``, ``clip_ratio_*`` as means of this micro-batch over its tokens, or over its
        sequences at sequence level, counted in ``clip_count``; ``entropy`` left 0 for the trainer).
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask, settings.beta)
    s = settings
    h = None if entropy is None else entropy.values  # [rows, T]
    entropy_cut = None if entropy is None else entropy.cut
    entropy_coef = None if entropy is None else entropy.coef
    mask = mask.bool()
    old = logp.detach() if old_logp is None else old_logp
    ratio = torch.exp(_LOG_RATIO[s.importance_sampling_level](logp, old, mask))  # [rows, T]
    per_token, parts = policy_term(logp, old, ratio, advantages, mask, s)
    if s.off_policy_mask_threshold is not None:
        keep = terms.off_policy_keep(logp, old, mask, advantages, s.off_policy_mask_threshold)
        per_token = per_token * keep[:, None].to(per_token.dtype)
    effective = mask  # the tokens the policy term acts on
    if (s.top_entropy_quantile < 1.0 or s.entropy_bonus) and h is None:
        raise ValueError("top_entropy_quantile < 1 and the entropy bonus need the per-token entropy")
    if s.top_entropy_quantile < 1.0:
        cut = terms.entropy_threshold(h, mask, s.top_entropy_quantile) if entropy_cut is None \
            else entropy_cut
        effective = terms.high_entropy_mask(h, mask, cut)
        per_token = per_token * effective.to(per_token.dtype)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    if s.use_bias_correction_kl and ref_logp is not None:
        kl = kl * kl_weight(logp, old, mask, s.importance_sampling_level)
    if s.beta > 0.0:
        per_token = per_token + s.beta * kl
    loss = _AGGREGATE[s.loss_type](per_token, mask, s, norm)
    stats = _stats(ratio, advantages, mask, kl, parts, s)
    stats.policy_loss = float(loss.detach())
    if s.entropy_bonus:
        coef = s.entropy_coef if entropy_coef is None else entropy_coef
        if coef != 0.0:
            loss = loss + entropy_bonus(h, effective, coef, norm)
        e = effective.to(torch.float32)
        sums = torch.stack([(h.detach().float() * e).sum(), e.sum()]).tolist()
        stats.bonus_entropy_sum, stats.bonus_tokens = sums
    return loss, stats


@dataclass(frozen=True)
class PolicyObjective:
    """``grpo_loss`` of one micro-batch as a function of its log-probs alone: the loss the fused LM head
    differentiates chunk by chunk (``fused.completion_loss``'s ``objective``). Its fields are ``grpo_loss``'s
    other arguments; no entropy (the fused path takes no entropy term)."""

    old_logp: Tensor | None
    ref_logp: Tensor | None
    advantages: Tensor
    mask: Tensor
    settings: LossSettings
    norm: Normaliser

    def __call__(self, logp: Tensor) -> Tensor:
        return grpo_loss(logp, self.old_logp, self.ref_logp, self.advantages, self.mask, self.settings, self.norm)[0]


def _stats(ratio: Tensor, advantages: Tensor, mask: Tensor, kl: Tensor, parts: dict[str, Tensor],
           s: LossSettings) -> LossStats:
    """Clip fractions per token, or per sequence at sequence level (as TRL logs them)."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    eps_low, eps_high = s.epsilon, s.upper_epsilon
    extra_names: list[str] = []
    if s.loss_type == "cispo":
        flags = [(ratio > eps_high) & (adv > 0)]
        extra_names = ["cispo_clip_ratio"]
    elif s.loss_type in CLIPPED_LOSS_TYPES:
        low = (ratio < 1.0 - eps_low) & (adv < 0)  # [rows, T]
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        flags = [low, high, low | high]
    else:
        flags = []
    if s.loss_type == "vespo":
        flags = [parts["phi"][:, None].expand_as(mask)]
        extra_names = ["vespo/phi_seq_mean"]
    kl_mean = _masked_means([kl], mask)[0]
    if s.importance_sampling_level == "sequence" or s.loss_type == "vespo":
        rows = mask.any(dim=1)  # one value per sequence: the first token carries it
        count = int(rows.sum())
        means = [float((f[:, 0].float() * rows).sum()) / max(count, 1) for f in flags]
    else:
        count = int(mask.sum())
        means = _masked_means(flags, mask) if flags else []
    stats = LossStats(kl=kl_mean, clip_count=count)
    if extra_names:
        stats.extra = dict(zip(extra_names, means))
    elif means:
        stats.clip_ratio_low, stats.clip_ratio_high, stats.clip_ratio_region = means
    return stats


# --- PPO's critic -------------------------------------------------------------------------------


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, cliprange_value: float,
               norm: Normaliser, vf_coef: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """PPO2's clipped value loss of one micro-batch (module docstring) -> (scalar, stats).

    ``values`` [rows, T] the critic's predictions (grad), ``old_values`` [rows, T] its predictions at
    sampling time, ``returns`` [rows, T] the GAE targets, ``mask`` [rows, T]. The divisor is the whole
    batch's token count (``norm.num_tokens``), so micro-batch losses add up to the batch's token mean.
    ``stats``: ``value/clipfrac`` (tokens whose clipped error was the larger) and the micro-batch's
    token mean of the unscaled loss, ``value/loss``, with ``tokens`` to weight it by.
    """
    if not values.shape == old_values.shape == returns.shape == mask.shape:
        raise ValueError(f"values, old_values, returns and mask must share a shape, got {tuple(values.shape)}, "
                         f"{tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(mask.shape)}")
    m = mask.to(values.dtype)
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    err, err_clipped = (values - returns) ** 2, (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(err, err_clipped)
    loss = vf_coef * (per_token * m).sum() / norm.num_tokens
    n = m.sum().clamp(min=1.0)
    # TRL's count (the clipped error was the larger), only where the clamp acted: elsewhere ``clipped`` is
    # ``values`` up to rounding, and a rounding tie must not count as a clipped token
    acted = (values - old_values).abs() > cliprange_value
    mean, clipfrac = torch.stack([(per_token.detach() * m).sum() / n,
                                  ((err_clipped > err) & acted).to(m.dtype).mul(m).sum() / n]).tolist()
    return loss, {"value/loss": mean, "value/clipfrac": clipfrac, "tokens": float(m.sum())}
