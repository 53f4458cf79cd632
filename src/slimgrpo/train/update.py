"""The policy update: log-probs through the chunked LM head, the GRPO loss, gradient accumulation
over micro-batches of completions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from slimgrpo.loss.logprobs import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser, grpo_loss
from slimgrpo.loss.unpadded import unpad_rows, unpadded_completion_logprobs
from slimgrpo.train.distributed import is_wrapped
from slimgrpo.train.micro import micro_batches, row_lengths
from slimgrpo.types import Rollout


@dataclass
class UpdateBatch:
    """Everything the loss needs for the rows of one step (this rank's share)."""

    input_ids: torch.Tensor  # [rows, P+T] prompt (left-padded) + completion (right-padded)
    attention_mask: torch.Tensor  # [rows, P+T]
    completion_ids: torch.Tensor  # [rows, T]
    loss_mask: torch.Tensor  # [rows, T] bool: completion tokens that count in the loss
    advantages: torch.Tensor  # [rows]
    old_logp: torch.Tensor | None = None  # [rows, T] (num_iterations > 1)
    ref_logp: torch.Tensor | None = None  # [rows, T] (beta > 0)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def T(self) -> int:
        return int(self.completion_ids.shape[1])


def make_update_batch(rollout: Rollout, advantages: torch.Tensor, mask_truncated: bool) -> UpdateBatch:
    prompt_ids, prompt_mask = rollout.row_prompt_ids()
    input_ids = torch.cat([prompt_ids, rollout.completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, rollout.completion_mask], dim=1).long()
    loss_mask = rollout.completion_mask.clone()
    if mask_truncated:
        loss_mask &= ~rollout.is_truncated.unsqueeze(1)
    return UpdateBatch(input_ids, attention_mask, rollout.completion_ids, loss_mask, advantages.float())


def micro_slices(rows: int, micro: int | None) -> list[slice]:
    micro = rows if not micro else min(micro, rows)
    return [slice(i, min(i + micro, rows)) for i in range(0, rows, micro)]


def trimmed(batch: UpdateBatch, sl: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """Inputs of one micro-batch without columns that are padding in every row of it.

    Returns (input_ids, attention_mask, completion_ids, tslice) where tslice selects the kept completion
    columns of the [rows, T] tensors."""
    ids, am = batch.input_ids[sl], batch.attention_mask[sl]
    P = ids.shape[1] - batch.T
    used_prompt = am[:, :P].any(dim=0).nonzero()
    start = int(used_prompt[0]) if used_prompt.numel() else 0
    comp_len = int(am[:, P:].sum(dim=1).max().item()) if batch.T else 0
    comp_len = max(comp_len, 1)
    end = P + comp_len
    return ids[:, start:end], am[:, start:end], batch.completion_ids[sl, :comp_len], slice(0, comp_len)


def micro_inputs(batch: UpdateBatch, rows: torch.Tensor):
    """Unpadded inputs of one micro-batch (``loss.unpadded``): (ids [m, L], prompt lengths [m],
    completion ids [m, Tm], scored mask [m, Tm], Tm) with L and Tm the micro-batch's own longest."""
    rows = rows.to(batch.input_ids.device)
    ids, p_len, c_len = unpad_rows(batch.input_ids, batch.attention_mask, batch.T, rows)
    tm = max(int(c_len.max()) if c_len.numel() else 1, 1)
    scored = batch.attention_mask[rows, batch.input_ids.shape[1] - batch.T:][:, :tm].bool()
    return ids, p_len, batch.completion_ids[rows, :tm], scored, tm


def unpadded_logprobs(model, batch: UpdateBatch, rows: torch.Tensor, dev=None, **kwargs):
    """[m, Tm] log-probs (and entropy) of ``rows``, unpadded, through any DDP/FSDP2 wrapper."""
    ids, p_len, comp, scored, tm = micro_inputs(batch, rows)
    if dev is not None:
        ids, p_len, comp, scored = ids.to(dev), p_len.to(dev), comp.to(dev), scored.to(dev)
    args = (ids, p_len, comp, scored)
    if is_wrapped(model):
        return model(unpadded_completion_logprobs, *args, **kwargs), tm
    return unpadded_completion_logprobs(model, *args, **kwargs), tm


def plan_micro(batch: UpdateBatch, micro: int | None, micro_tokens: int | None) -> list[torch.Tensor]:
    """Row indices of the micro-batches (``train.micro``)."""
    return micro_batches(row_lengths(batch.attention_mask).cpu(), micro, micro_tokens)


def model_logprobs(model, *args, **kwargs):
    """``completion_logprobs`` of a causal LM, or through a DDP / FSDP2 wrapper's own forward (so that
    DDP syncs the gradients and FSDP2 gathers the root weights; see ``distributed.ModelForward``)."""
    if is_wrapped(model):
        return model(completion_logprobs, *args, **kwargs)
    return completion_logprobs(model, *args, **kwargs)


def batch_logprobs(model, batch: UpdateBatch, micro: int | None, temperature: float, token_chunk: int,
                   vocab_chunk: int | None, micro_tokens: int | None = None) -> torch.Tensor:
    """[rows, T] log-probs without gradients (old / reference policy), micro-batch by micro-batch."""
    out = torch.zeros(batch.rows, batch.T, dtype=torch.float32, device=batch.input_ids.device)
    dev = next(model.parameters()).device  # the full-fine-tuning reference may live on the CPU
    with torch.no_grad():
        for rows in plan_micro(batch, micro, micro_tokens):
            (logp, _), tm = unpadded_logprobs(model, batch, rows, dev, temperature=temperature,
                                              token_chunk=token_chunk, vocab_chunk=vocab_chunk)
            out[rows.to(out.device), :tm] = logp.float().to(out.device)
    return out


@dataclass
class UpdateStats:
    loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_ratio_low: float = 0.0
    clip_ratio_high: float = 0.0
    clip_ratio_region: float = 0.0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def accumulate_gradients(
    model,
    batch: UpdateBatch,
    settings: LossSettings,
    norm: Normaliser,
    micro: int | None,
    temperature: float,
    token_chunk: int,
    vocab_chunk: int | None,
    loss_scale: float = 1.0,
    no_sync=None,
    offload_activations: bool = False,
    micro_tokens: int | None = None,
) -> UpdateStats:
    """Forward + backward over all micro-batches; gradients are summed into ``.grad``.

    ``norm`` holds the totals of the whole batch, so the sum of the micro-batch losses equals the batch
    loss exactly, whatever the micro-batch size. ``loss_scale`` compensates for DDP's gradient averaging:
    with ``norm`` counting every rank's rows, rank r's loss is its share L_r of the global loss, DDP and
    FSDP2 average the gradients of ``world_size * L_r`` over ranks, which gives the gradient of sum_r L_r,
    i.e. exactly the single-process gradient of the whole batch (every ``loss_type``; bnpo's divisor is
    the local token count by definition). ``no_sync`` (DDP) suppresses the all-reduce on all but the last
    micro-batch; FSDP2 reduce-scatters after every micro-batch, keeping gradients sharded.
    ``offload_activations``: tensors saved for backward during the forward pass move to host memory
    (pinned on CUDA) and come back when backward needs them. With gradient checkpointing those are
    essentially the checkpointed layer inputs; recomputation in backward happens outside this context,
    so it stays on the device. Gradients are unchanged (the same values make the round trip).
    Rows run unpadded (no attention mask, ``loss.unpadded``); ``micro_tokens`` forms micro-batches by
    a token budget instead of a row count (``train.micro``)."""
    stats = UpdateStats()
    weight_sum = 0
    groups = plan_micro(batch, micro, micro_tokens)
    for i, rows in enumerate(groups):
        rows = rows.to(batch.input_ids.device)
        sync_ctx = no_sync() if (no_sync is not None and i < len(groups) - 1) else _null()
        with sync_ctx:
            with offload_context(offload_activations, batch.input_ids.device):
                (logp, entropy), tm = unpadded_logprobs(model, batch, rows, temperature=temperature,
                                                        token_chunk=token_chunk, vocab_chunk=vocab_chunk,
                                                        return_entropy=True)
            ts = slice(0, tm)
            mask = batch.loss_mask[rows, ts]
            old = batch.old_logp[rows, ts] if batch.old_logp is not None else None
            ref = batch.ref_logp[rows, ts] if batch.ref_logp is not None else None
            loss, ls = grpo_loss(logp, old, ref, batch.advantages[rows], mask, settings, norm)
            (loss * loss_scale).backward()
        n = int(mask.sum())
        stats.loss += float(loss.detach())
        if n:
            stats.kl += ls.kl * n
            stats.clip_ratio_low += ls.clip_ratio_low * n
            stats.clip_ratio_high += ls.clip_ratio_high * n
            stats.clip_ratio_region += ls.clip_ratio_region * n
            if entropy is not None:
                stats.entropy += float((entropy.detach().float() * mask).sum())
        weight_sum += n
    d = max(weight_sum, 1)
    stats.kl /= d
    stats.clip_ratio_low /= d
    stats.clip_ratio_high /= d
    stats.clip_ratio_region /= d
    stats.entropy /= d
    stats.tokens = weight_sum
    return stats


def offload_context(enabled: bool, device: torch.device):
    if not enabled:
        return _null()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
