"""The loss of one micro-batch: through the fused LM head + loss where it applies, else log-probs then loss.

One straight route down: the layout is chosen (``forward.layout.choose_layout``), the model runs once through the
wrapper's forward (``forward.layout.forward``) into the head (``forward.passes``: the fused ``completion_loss``
with the policy's objective, ``objectives.PolicyObjective``, or ``completion_logprobs``), and the objective is
called once more here for the statistics. Both routes return the same loss, statistics and (after ``backward``)
gradients; the fused one runs one fewer product through the LM head per token chunk (``slimgrpo.loss.fused``).
"""

from __future__ import annotations

import dataclasses

import torch

from slimgrpo.config.sections.loss import takes_fused_path
from slimgrpo.containers import LossStats
from slimgrpo.forward.layout import choose_layout, forward
from slimgrpo.forward.passes import completion_logprobs, completion_loss
from slimgrpo.loss.objectives import Normaliser, PolicyObjective, TokenEntropy, grpo_loss
from slimgrpo.update.micro import MicroBatch
from slimgrpo.update.settings import UpdateSettings


def micro_batch_loss(model, micro: MicroBatch, settings: UpdateSettings, norm: Normaliser,
                     entropy_coef: float | None = None) -> tuple[torch.Tensor, LossStats, torch.Tensor | None]:
    """``(loss, stats, entropy [rows, T])`` of one micro-batch; call ``loss.backward()`` afterwards.

    ``settings.fuse`` (the spec's verdict, ``runspec.run.fused_loss``) picks the fused path; ``takes_fused_path``
    (config) is the rule, applied here with this step's entropy coefficient; the forward layout is
    ``forward.layout.choose_layout``'s. ``micro.entropy_cut``: the batch's entropy threshold for
    ``top_entropy_quantile < 1`` (that mask needs every token's entropy before the loss, so it takes the
    unfused path). ``entropy_coef``: the entropy-bonus coefficient of this optimizer step (None:
    ``settings.loss.entropy_coef``); when it is not 0 the entropy needs its gradient, which the unfused path
    gives. The fused path's loss carries the gradient and the objective's second call only the statistics
    (its log-probs carry none); the unfused path's one call gives both."""
    loss_settings = settings.loss
    coef = loss_settings.entropy_coef if entropy_coef is None else entropy_coef
    entropy_grad = loss_settings.entropy_bonus and coef != 0.0
    rows = micro.completion_rows
    head = dict(temperature=settings.temperature, token_chunk=settings.token_chunk,
                hidden_fn=choose_layout(model, rows, settings.share_prompt, with_grad=True))
    fused_loss = None
    if takes_fused_path(settings.fuse, loss_settings.top_entropy_quantile, entropy_grad,
                        loss_settings.importance_sampling_level, micro.old_logp is not None, settings.vocab_chunk):
        policy_only = dataclasses.replace(loss_settings, entropy_coef=0.0, use_adaptive_entropy=False)
        objective = PolicyObjective(micro.old_logp, micro.ref_logp, micro.advantages, micro.loss_mask, policy_only,
                                    norm)
        fused_loss, logp, entropy = forward(model, completion_loss, rows, objective, return_entropy=True, **head)
        coef = 0.0  # the fused loss has no entropy term (fusable: no entropy gradient)
    else:
        logp, entropy = forward(model, completion_logprobs, rows, vocab_chunk=settings.vocab_chunk,
                                return_entropy=True, entropy_grad=entropy_grad, **head)
    ent = None if entropy is None else TokenEntropy(entropy, cut=micro.entropy_cut, coef=coef)
    loss, stats = grpo_loss(logp, micro.old_logp, micro.ref_logp, micro.advantages, micro.loss_mask, loss_settings,
                            norm, entropy=ent)
    return (loss if fused_loss is None else fused_loss), stats, entropy
