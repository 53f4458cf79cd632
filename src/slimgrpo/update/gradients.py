"""The passes over an update batch, each one loop over ``micro.micro_batches``: log-probs without gradients
(old / reference policy, the entropy cut) and forward + backward with gradient accumulation."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch

from slimgrpo.collectives import SINGLE, Collectives
from slimgrpo.forward.layout import choose_layout, forward
from slimgrpo.forward.passes import completion_logprobs
from slimgrpo.forward.rows import CompletionRows
from slimgrpo.loss.objectives import Normaliser
from slimgrpo.update.batch import UpdateBatch, UpdateStats, add_sums, stat_sums, token_means
from slimgrpo.update.micro import micro_batches
from slimgrpo.update.micro_loss import micro_batch_loss
from slimgrpo.update.offload import offload_context
from slimgrpo.update.settings import UpdateSettings


def batch_logprobs(model, batch: UpdateBatch, settings: UpdateSettings, ranks: Collectives = SINGLE,
                   want_entropy: bool = False):
    """[rows, T] log-probs without gradients (old / reference policy), micro-batch by micro-batch
    (``settings.micro_rows`` rows, or the ``micro_tokens`` budget; ``ranks``: the FSDP2 count agreement).
    ``want_entropy``: return ``(logp, entropy)``, both [rows, T]. ``settings.share_prompt``
    (``memory.share_prompt_forward``): each group's prompt runs once where rows share it, packed with the
    completions where that is less work (``forward.layout.choose_layout``); without gradients nothing is kept for
    backward, so this saves time at no memory cost."""
    out = torch.zeros(batch.rows, batch.T, dtype=torch.float32, device=batch.input_ids.device)
    ent = torch.zeros_like(out) if want_entropy else None
    dev = next(model.parameters()).device  # the full-fine-tuning reference may live on the CPU
    with torch.no_grad():
        for micro in micro_batches(batch, settings, ranks):
            rows = CompletionRows(micro.input_ids.to(dev), micro.attention_mask.to(dev), micro.T,
                                  micro.completion_ids.to(dev))
            logp, e = forward(model, completion_logprobs, rows, temperature=settings.temperature,
                              token_chunk=settings.token_chunk, hidden_fn=choose_layout(model, rows, settings.share_prompt, False),
                              vocab_chunk=settings.vocab_chunk, return_entropy=want_entropy)
            out[micro.rows, micro.columns] = logp.float().to(out.device)
            if ent is not None:
                ent[micro.rows, micro.columns] = e.float().to(out.device)
    return (out, ent) if want_entropy else out


def entropy_cut(model, batch: UpdateBatch, settings: UpdateSettings, ranks: Collectives = SINGLE
                ) -> torch.Tensor | None:
    """The whole batch's entropy threshold for ``top_entropy_quantile``, from a no-grad pass (unshared
    prompts); None when the update is a single micro-batch (the loss then takes it from that micro-batch: the
    same value, recomputed every iteration with the current policy, as TRL does)."""
    quantile = settings.loss.top_entropy_quantile
    if quantile >= 1.0 or len(micro_batches(batch, settings, ranks)) <= 1:
        return None
    from slimgrpo.loss.policy_losses import entropy_threshold

    _, ent = batch_logprobs(model, batch, dataclasses.replace(settings, share_prompt=None), ranks, want_entropy=True)
    return entropy_threshold(ent, batch.loss_mask, quantile)


def accumulate_gradients(model, batch: UpdateBatch, settings: UpdateSettings, norm: Normaliser,
                         ranks: Collectives = SINGLE, entropy_coef: float | None = None, loss_scale: float = 1.0,
                         no_sync: Callable[[], contextlib.AbstractContextManager] | None = None) -> UpdateStats:
    """Forward + backward over all micro-batches; gradients are summed into ``.grad``.

    ``norm`` holds the totals of the whole batch, so the sum of the micro-batch losses equals the batch
    loss exactly, whatever the micro-batch size. ``loss_scale`` compensates for DDP's gradient averaging:
    with ``norm`` counting every rank's rows, rank r's loss is its share L_r of the global loss, DDP and
    FSDP2 average the gradients of ``world_size * L_r`` over ranks, which gives the gradient of sum_r L_r,
    i.e. exactly the single-process gradient of the whole batch (every ``loss_type``; bnpo's divisor is
    the local token count by definition). ``no_sync`` (DDP) suppresses the all-reduce on all but the last
    micro-batch; FSDP2 reduce-scatters after every micro-batch, keeping gradients sharded.
    ``settings.offload_activations``: tensors saved for backward during the forward pass move to host memory
    (pinned, copied on a side stream on CUDA: ``offload.py``) and come back when backward needs them. With
    gradient checkpointing those are essentially the checkpointed layer inputs; recomputation in backward
    happens outside this context, so it stays on the device. Gradients are unchanged (the same values make
    the round trip). Each micro-batch's loss is ``micro_loss.micro_batch_loss``'s (fused head + loss, the
    layout of ``forward.layout.choose_layout``); ``settings.micro_tokens`` forms micro-batches by a token budget instead
    of a row count, and ``ranks`` agree on their count under FSDP2 (``micro.micro_batches``). ``entropy_coef``:
    the entropy-bonus coefficient of this optimizer step (``loss.entropy_control``); with ``norm.entropy_tokens``
    unset the bonus is a per-micro-batch mean, averaged over the micro-batches."""
    sums = stat_sums(UpdateStats())
    bonus_sum = bonus_tokens = 0.0
    micros = micro_batches(batch, settings, ranks)
    if settings.loss.entropy_bonus and norm.entropy_tokens is None:
        norm = dataclasses.replace(norm, entropy_parts=norm.entropy_parts * len(micros))
    for i, micro in enumerate(micros):
        mask = micro.loss_mask
        sync_ctx = no_sync() if (no_sync is not None and i < len(micros) - 1) else contextlib.nullcontext()
        with sync_ctx:
            with offload_context(settings.offload_activations, micro.input_ids.device, settings.target):
                loss, ls, entropy = micro_batch_loss(model, micro, settings, norm, entropy_coef)
            (loss * loss_scale).backward()
        n = int(mask.sum())
        bonus_sum += ls.bonus_entropy_sum
        bonus_tokens += ls.bonus_tokens
        part = UpdateStats(loss=float(loss.detach()), policy_loss=ls.policy_loss)
        if n:  # c: tokens, or sequences at sequence level
            part = UpdateStats(loss=part.loss, policy_loss=ls.policy_loss, kl=ls.kl,
                               clip_ratio_low=ls.clip_ratio_low, clip_ratio_high=ls.clip_ratio_high,
                               clip_ratio_region=ls.clip_ratio_region, tokens=n, clip_count=ls.clip_count,
                               extra=ls.extra)
        part_sums = stat_sums(part)
        if n and entropy is not None:  # the entropy's sum over the micro-batch's tokens
            part_sums["entropy"] = float((entropy.detach().float() * mask).sum())
        sums = add_sums(sums, part_sums)
    stats = token_means(sums)
    stats.bonus_entropy_sum, stats.bonus_tokens = bonus_sum, bonus_tokens
    return stats
