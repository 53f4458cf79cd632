"""The loss of one micro-batch: through the fused LM head + loss where it applies, else log-probs then loss.

Both routes return the same loss, statistics and (after ``backward``) gradients; the fused one runs one
fewer product through the LM head per token chunk (``slimgrpo.loss.fused``).
"""

from __future__ import annotations

import dataclasses

import torch

from slimgrpo.loss.fused import completion_loss, fused_applicable
from slimgrpo.loss.logprobs import completion_logprobs
from slimgrpo.loss.objectives import Normaliser, grpo_loss
from slimgrpo.train.update.batch import MicroBatch
from slimgrpo.train.update.layout import forward, hidden_fn
from slimgrpo.train.update.settings import UpdateSettings
from slimgrpo.types import LossStats


def micro_batch_loss(model, micro: MicroBatch, settings: UpdateSettings, norm: Normaliser,
                     entropy_coef: float | None = None) -> tuple[torch.Tensor, LossStats, torch.Tensor | None]:
    """``(loss, stats, entropy [rows, T])`` of one micro-batch; call ``loss.backward()`` afterwards.

    ``settings.fuse`` (``loss.fuse_head_loss``) picks the fused path where ``fused_applicable`` allows it;
    the forward layout is ``layout.hidden_fn``'s. ``micro.entropy_cut``: the batch's entropy threshold for
    ``top_entropy_quantile < 1`` (that mask needs every token's entropy before the loss, so it takes the
    unfused path). ``entropy_coef``: the entropy-bonus coefficient of this optimizer step (None:
    ``settings.loss.entropy_coef``); when it is not 0 the entropy needs its gradient, which the unfused path
    gives."""
    ids, am, comp, mask, T = micro.input_ids, micro.attention_mask, micro.completion_ids, micro.loss_mask, micro.T
    old, ref, advantages, loss_settings = micro.old_logp, micro.ref_logp, micro.advantages, settings.loss
    layout = hidden_fn(model, ids, am, T, settings.share_prompt, with_grad=True)
    coef = loss_settings.entropy_coef if entropy_coef is None else entropy_coef
    entropy_grad = loss_settings.entropy_bonus and coef != 0.0
    fusable = loss_settings.top_entropy_quantile >= 1.0 and not entropy_grad
    if settings.fuse and fusable and fused_applicable(loss_settings.importance_sampling_level, old is not None,
                                                      settings.vocab_chunk):
        policy_only = dataclasses.replace(loss_settings, entropy_coef=0.0, use_adaptive_entropy=False)

        def objective(logp: torch.Tensor) -> torch.Tensor:
            return grpo_loss(logp, old, ref, advantages, mask, policy_only, norm)[0]

        loss, logp, entropy = forward(model, completion_loss, ids, am, T, comp, objective,
                                      temperature=settings.temperature, token_chunk=settings.token_chunk,
                                      return_entropy=True, hidden_fn=layout)
        _, stats = grpo_loss(logp, old, ref, advantages, mask, loss_settings, norm, entropy=entropy, entropy_coef=0.0)
        return loss, stats, entropy
    logp, entropy = forward(model, completion_logprobs, ids, am, T, comp, temperature=settings.temperature,
                            token_chunk=settings.token_chunk, vocab_chunk=settings.vocab_chunk, return_entropy=True,
                            hidden_fn=layout, entropy_grad=entropy_grad)
    loss, stats = grpo_loss(logp, old, ref, advantages, mask, loss_settings, norm, entropy=entropy,
                            entropy_cut=micro.entropy_cut, entropy_coef=coef)
    return loss, stats, entropy
