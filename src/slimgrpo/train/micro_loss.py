"""The loss of one micro-batch: through the fused LM head + loss where it applies, else log-probs then loss.

Both routes return the same loss, statistics and (after ``backward``) gradients; the fused one runs one
fewer product through the LM head per token chunk (``slimgrpo.loss.fused``).
"""

from __future__ import annotations

import dataclasses

import torch

from slimgrpo.loss import packed
from slimgrpo.loss.fused import completion_loss, fused_applicable
from slimgrpo.loss.logprobs import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss
from slimgrpo.loss.unpadded import unpadded_hidden
from slimgrpo.train import shared_prompt
from slimgrpo.train.distributed import is_wrapped
from slimgrpo.types import LossStats


def _call(model, fn, *args, **kwargs):
    """``fn(model, ...)``, through a DDP / FSDP2 wrapper's own forward when there is one."""
    if is_wrapped(model):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)


def _unwrapped(model):
    """The causal LM inside a DDP / FSDP2 ``ModelForward`` wrapper (or the model itself)."""
    inner = getattr(model, "module", model)
    return getattr(inner, "model", inner) if is_wrapped(model) else model


def micro_batch_loss(
    model, ids: torch.Tensor, am: torch.Tensor, comp: torch.Tensor, mask: torch.Tensor,
    old: torch.Tensor | None, ref: torch.Tensor | None, advantages: torch.Tensor,
    settings: LossSettings, norm: Normaliser, temperature: float, token_chunk: int | None,
    vocab_chunk: int | None, fuse: bool = True, share_prompt: bool = False,
    entropy_cut: torch.Tensor | float | None = None, entropy_coef: float | None = None,
) -> tuple[torch.Tensor, LossStats, torch.Tensor | None]:
    """``(loss, stats, entropy [rows, T])`` of one micro-batch; call ``loss.backward()`` afterwards.

    ``fuse`` (``loss.fuse_head_loss``) picks the fused path where ``fused_applicable`` allows it;
    ``share_prompt`` (``memory.share_prompt_forward``) runs each group's prompt once: packed into one
    sequence with the completions where ``packed.cheaper`` says that is less work, else fanned out where
    ``shared_prompt.applicable`` allows it. ``entropy_cut``: the batch's entropy threshold for
    ``top_entropy_quantile < 1`` (that mask needs every token's entropy before the loss, so it takes the
    unfused path). ``entropy_coef``: the entropy-bonus coefficient of this optimizer step (None:
    ``settings.entropy_coef``); when it is not 0 the entropy needs its gradient, which the unfused path gives.
    """
    T = comp.shape[1]
    hidden_fn = unpadded_hidden  # rows re-laid without padding: no attention mask, no [rows, 1, S, S] tensor
    if share_prompt:
        lm = _unwrapped(model)
        shared = shared_prompt.applicable(lm, ids, am, T)  # groups, or 0 where the fanned-out layout is not used
        if packed.cheaper(lm, ids, am, T, shared):
            hidden_fn = packed.packed_completion_hidden  # only real tokens, each prompt once, one sequence
        elif shared:
            hidden_fn = shared_prompt.shared_completion_hidden
    coef = settings.entropy_coef if entropy_coef is None else entropy_coef
    entropy_grad = settings.entropy_bonus and coef != 0.0
    fusable = settings.top_entropy_quantile >= 1.0 and not entropy_grad
    if fuse and fusable and fused_applicable(settings.importance_sampling_level, old is not None, vocab_chunk):
        policy_only = dataclasses.replace(settings, entropy_coef=0.0, use_adaptive_entropy=False)

        def objective(logp: torch.Tensor) -> torch.Tensor:
            return grpo_loss(logp, old, ref, advantages, mask, policy_only, norm)[0]

        loss, logp, entropy = _call(model, completion_loss, ids, am, T, comp, objective,
                                    temperature=temperature, token_chunk=token_chunk, return_entropy=True,
                                    hidden_fn=hidden_fn)
        _, stats = grpo_loss(logp, old, ref, advantages, mask, settings, norm, entropy=entropy, entropy_coef=0.0)
        return loss, stats, entropy
    logp, entropy = _call(model, completion_logprobs, ids, am, T, comp, temperature=temperature,
                          token_chunk=token_chunk, vocab_chunk=vocab_chunk, return_entropy=True, hidden_fn=hidden_fn,
                          entropy_grad=entropy_grad)
    loss, stats = grpo_loss(logp, old, ref, advantages, mask, settings, norm, entropy=entropy, entropy_cut=entropy_cut,
                            entropy_coef=coef)
    return loss, stats, entropy
