"""The loss of one micro-batch: through the fused LM head + loss where it applies, else log-probs then loss.

Both routes return the same loss, statistics and (after ``backward``) gradients; the fused one runs one
fewer product through the LM head per token chunk (``slimgrpo.loss.fused``).
"""

from __future__ import annotations

import torch

from slimgrpo.loss.fused import completion_loss, fused_applicable
from slimgrpo.loss.logprobs import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss
from slimgrpo.train.distributed import is_wrapped
from slimgrpo.types import LossStats


def _call(model, fn, *args, **kwargs):
    """``fn(model, ...)``, through a DDP / FSDP2 wrapper's own forward when there is one."""
    if is_wrapped(model):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)


def micro_batch_loss(
    model, ids: torch.Tensor, am: torch.Tensor, comp: torch.Tensor, mask: torch.Tensor,
    old: torch.Tensor | None, ref: torch.Tensor | None, advantages: torch.Tensor,
    settings: LossSettings, norm: Normaliser, temperature: float, token_chunk: int | None,
    vocab_chunk: int | None, fuse: bool = True,
) -> tuple[torch.Tensor, LossStats, torch.Tensor | None]:
    """``(loss, stats, entropy [rows, T])`` of one micro-batch; call ``loss.backward()`` afterwards.

    ``fuse`` (``loss.fuse_head_loss``) picks the fused path where ``fused_applicable`` allows it.
    """
    T = comp.shape[1]
    if fuse and fused_applicable(settings.importance_sampling_level, old is not None, vocab_chunk):
        def objective(logp: torch.Tensor) -> torch.Tensor:
            return grpo_loss(logp, old, ref, advantages, mask, settings, norm)[0]

        loss, logp, entropy = _call(model, completion_loss, ids, am, T, comp, objective,
                                    temperature=temperature, token_chunk=token_chunk, return_entropy=True)
        _, stats = grpo_loss(logp, old, ref, advantages, mask, settings, norm)
        return loss, stats, entropy
    logp, entropy = _call(model, completion_logprobs, ids, am, T, comp, temperature=temperature,
                          token_chunk=token_chunk, vocab_chunk=vocab_chunk, return_entropy=True)
    loss, stats = grpo_loss(logp, old, ref, advantages, mask, settings, norm)
    return loss, stats, entropy
