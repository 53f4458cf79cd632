"""The policy update: log-probs through the chunked LM head, the GRPO loss, gradient accumulation
over micro-batches of completions."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from slimgrpo.loss import packed
from slimgrpo.loss.logprobs import completion_logprobs
from slimgrpo.loss.objectives import LossSettings, Normaliser
from slimgrpo.train import shared_prompt
from slimgrpo.train.distributed import is_wrapped
from slimgrpo.loss.unpadded import unpadded_hidden
from slimgrpo.train.micro import micro_batches, row_lengths
from slimgrpo.train.micro_loss import micro_batch_loss
from slimgrpo.types import Rollout


@dataclass
class UpdateBatch:
    """Everything the loss needs for the rows of one step (this rank's share)."""

    input_ids: torch.Tensor  # [rows, P+T] prompt (left-padded) + completion (right-padded)
    attention_mask: torch.Tensor  # [rows, P+T]
    completion_ids: torch.Tensor  # [rows, T]
    loss_mask: torch.Tensor  # [rows, T] bool: completion tokens that count in the loss
    advantages: torch.Tensor  # [rows], or [rows, T] per token (PPO's GAE advantages)
    old_logp: torch.Tensor | None = None  # [rows, T] (num_iterations > 1)
    ref_logp: torch.Tensor | None = None  # [rows, T] (beta > 0)
    entropy_cut: torch.Tensor | None = None  # whole-batch entropy threshold (top_entropy_quantile < 1)
    old_values: torch.Tensor | None = None  # [rows, T] the critic's values at sampling time (PPO)
    returns: torch.Tensor | None = None  # [rows, T] the critic's targets, GAE advantages + values (PPO)

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
    loss_mask = rollout.model_mask.clone()  # tool results stay in the context, out of the loss and KL
    if mask_truncated:
        loss_mask &= ~rollout.is_truncated.unsqueeze(1)
    return UpdateBatch(input_ids, attention_mask, rollout.completion_ids, loss_mask, advantages.float())


def plan_micro(batch: UpdateBatch, micro: int | None, micro_tokens: int | None) -> list[torch.Tensor]:
    """Row indices of the micro-batches: ``micro`` rows at a time in order, or packed by the token budget
    ``micro_tokens`` (``train.micro``)."""
    return [rows.to(batch.input_ids.device)
            for rows in micro_batches(row_lengths(batch.attention_mask).cpu(), micro, micro_tokens)]


def trimmed(batch: UpdateBatch, sl: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """Inputs of one micro-batch (a slice or row indices) without columns that are padding in every row of it.

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


def model_logprobs(model, *args, **kwargs):
    """``completion_logprobs`` of a causal LM on unpadded rows (``loss.unpadded``: no attention mask, no
    ``[rows, 1, S, S]`` tensor), or through a DDP / FSDP2 wrapper's own forward (so that DDP syncs the
    gradients and FSDP2 gathers the root weights; see ``distributed.ModelForward``)."""
    kwargs.setdefault("hidden_fn", unpadded_hidden)
    if is_wrapped(model):
        return model(completion_logprobs, *args, **kwargs)
    return completion_logprobs(model, *args, **kwargs)


def batch_logprobs(model, batch: UpdateBatch, micro: int | None, temperature: float, token_chunk: int,
                   vocab_chunk: int | None, want_entropy: bool = False, micro_tokens: int | None = None,
                   share_prompt: bool = False):
    """[rows, T] log-probs without gradients (old / reference policy), micro-batch by micro-batch
    (``micro`` rows, or the ``micro_tokens`` budget). ``want_entropy``: return ``(logp, entropy)``, both [rows, T].
    ``share_prompt`` (``memory.share_prompt_forward``): each group's prompt runs once where rows share it
    (``shared_prompt.shares_work``), packed with the completions where that is less work
    (``packed.cheaper``); without gradients nothing is kept for backward, so this saves time at no memory
    cost."""
    out = torch.zeros(batch.rows, batch.T, dtype=torch.float32, device=batch.input_ids.device)
    ent = torch.zeros_like(out) if want_entropy else None
    dev = next(model.parameters()).device  # the full-fine-tuning reference may live on the CPU
    with torch.no_grad():
        for sl in plan_micro(batch, micro, micro_tokens):
            ids, am, comp, ts = trimmed(batch, sl)
            ids, am, comp = ids.to(dev), am.to(dev), comp.to(dev)
            extra = {}
            if share_prompt and not is_wrapped(model):
                groups = shared_prompt.shares_work(model, ids, am, comp.shape[1])
                if packed.cheaper(model, ids, am, comp.shape[1], groups):
                    extra = {"hidden_fn": packed.packed_completion_hidden}
                elif groups:
                    extra = {"hidden_fn": shared_prompt.shared_completion_hidden}
            logp, e = model_logprobs(model, ids, am, comp.shape[1], comp,
                                     temperature=temperature, token_chunk=token_chunk, vocab_chunk=vocab_chunk,
                                     return_entropy=want_entropy, **extra)
            out[sl, ts] = logp.float().to(out.device)
            if ent is not None:
                ent[sl, ts] = e.float().to(out.device)
    return (out, ent) if want_entropy else out


@dataclass
class UpdateStats:
    loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_ratio_low: float = 0.0
    clip_ratio_high: float = 0.0
    clip_ratio_region: float = 0.0
    tokens: int = 0
    clip_count: int = 0  # what the clip ratios average over: tokens, or sequences at sequence level
    extra: dict[str, float] = field(default_factory=dict)
    bonus_entropy_sum: float = 0.0  # entropy bonus: entropy summed over the tokens it acted on (this rank)
    bonus_tokens: float = 0.0  # and their count


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
    fuse: bool = True,
    share_prompt: bool = False,
    micro_tokens: int | None = None,
    entropy_coef: float | None = None,
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
    (pinned, copied on a side stream on CUDA: ``train/offload.py``) and come back when backward needs
    them. With gradient checkpointing those are
    essentially the checkpointed layer inputs; recomputation in backward happens outside this context,
    so it stays on the device. Gradients are unchanged (the same values make the round trip).
    ``fuse``: the fused LM head + loss where it applies; ``share_prompt``: each group's prompt forward and
    backward once (``micro_loss.micro_batch_loss``). Rows run unpadded (``loss.unpadded``); ``micro_tokens``
    forms micro-batches by a token budget instead of a row count (``train.micro``). ``entropy_coef``: the
    entropy-bonus coefficient of this optimizer step (``loss.entropy_control``); with ``norm.entropy_tokens``
    unset the bonus is a per-micro-batch mean, averaged over the micro-batches."""
    stats = UpdateStats()
    weight_sum = clip_sum = 0
    slices = plan_micro(batch, micro, micro_tokens)
    if settings.entropy_bonus and norm.entropy_tokens is None:
        norm = dataclasses.replace(norm, entropy_parts=norm.entropy_parts * len(slices))
    for i, sl in enumerate(slices):
        ids, am, comp, ts = trimmed(batch, sl)
        mask = batch.loss_mask[sl, ts]
        sync_ctx = no_sync() if (no_sync is not None and i < len(slices) - 1) else contextlib.nullcontext()
        with sync_ctx:
            old = batch.old_logp[sl, ts] if batch.old_logp is not None else None
            ref = batch.ref_logp[sl, ts] if batch.ref_logp is not None else None
            advantages = batch.advantages[sl, ts] if batch.advantages.dim() == 2 else batch.advantages[sl]
            with offload_context(offload_activations, ids.device):
                loss, ls, entropy = micro_batch_loss(model, ids, am, comp, mask, old, ref, advantages,
                                                     settings, norm, temperature, token_chunk, vocab_chunk, fuse,
                                                     share_prompt, entropy_cut=batch.entropy_cut,
                                                     entropy_coef=entropy_coef)
            (loss * loss_scale).backward()
        n = int(mask.sum())
        stats.loss += float(loss.detach())
        stats.bonus_entropy_sum += ls.bonus_entropy_sum
        stats.bonus_tokens += ls.bonus_tokens
        if n:
            stats.kl += ls.kl * n
            c = ls.clip_count  # tokens, or sequences at sequence level
            stats.clip_ratio_low += ls.clip_ratio_low * c
            stats.clip_ratio_high += ls.clip_ratio_high * c
            stats.clip_ratio_region += ls.clip_ratio_region * c
            for key, value in ls.extra.items():
                stats.extra[key] = stats.extra.get(key, 0.0) + value * c
            clip_sum += c
            if entropy is not None:
                stats.entropy += float((entropy.detach().float() * mask).sum())
        weight_sum += n
    d, dc = max(weight_sum, 1), max(clip_sum, 1)
    stats.kl /= d
    stats.clip_ratio_low /= dc
    stats.clip_ratio_high /= dc
    stats.clip_ratio_region /= dc
    stats.extra = {k: v / dc for k, v in stats.extra.items()}
    stats.entropy /= d
    stats.tokens = weight_sum
    stats.clip_count = clip_sum
    return stats


def entropy_cut(model, batch: UpdateBatch, quantile: float, micro: int | None, temperature: float,
                token_chunk: int, vocab_chunk: int | None, micro_tokens: int | None = None) -> torch.Tensor | None:
    """The whole batch's entropy threshold for ``top_entropy_quantile``, from a no-grad pass; None when
    the update is a single micro-batch (the loss then takes it from that micro-batch: the same value,
    recomputed every iteration with the current policy, as TRL does)."""
    if quantile >= 1.0 or len(plan_micro(batch, micro, micro_tokens)) <= 1:
        return None
    from slimgrpo.loss.policy_losses import entropy_threshold

    _, ent = batch_logprobs(model, batch, micro, temperature, token_chunk, vocab_chunk, want_entropy=True,
                            micro_tokens=micro_tokens)
    return entropy_threshold(ent, batch.loss_mask, quantile)


def offload_context(enabled: bool, device: torch.device):
    """Pinned, asynchronous offload on CUDA; ``save_on_cpu`` elsewhere (see ``train/offload.py``)."""
    from slimgrpo.train.offload import offload_context as _offload

    return _offload(enabled, device)


def split_update(batch: UpdateBatch, parts: int) -> list[UpdateBatch]:
    """``parts`` consecutive row slices of ``batch`` (``steps_per_generation``: one optimizer step each)."""
    if parts == 1:
        return [batch]
    if batch.rows < parts:
        raise ValueError(f"{batch.rows} completions on this process cannot feed loss.steps_per_generation={parts} "
                         "optimizer steps: raise run.batch_size or lower loss.steps_per_generation")
    bounds = torch.linspace(0, batch.rows, parts + 1).round().long().tolist()
    per_row = {f.name for f in dataclasses.fields(batch)} - {"entropy_cut"}  # entropy_cut: the whole batch's
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = {k: None if getattr(batch, k) is None else getattr(batch, k)[a:b] for k in per_row}
        out.append(dataclasses.replace(batch, **rows))
    return out


def merge_stats(parts: list[UpdateStats]) -> UpdateStats:
    """Statistics of several optimizer steps as one: the loss averaged over steps, token means
    weighted by tokens, clip fractions by what they count."""
    if len(parts) == 1:
        return parts[0]
    out = UpdateStats(loss=sum(p.loss for p in parts) / len(parts))
    out.tokens = sum(p.tokens for p in parts)
    out.clip_count = sum(p.clip_count for p in parts)
    n, c = max(out.tokens, 1), max(out.clip_count, 1)
    out.kl = sum(p.kl * p.tokens for p in parts) / n
    out.entropy = sum(p.entropy * p.tokens for p in parts) / n
    for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_region"):
        setattr(out, key, sum(getattr(p, key) * p.clip_count for p in parts) / c)
    for key in parts[0].extra:
        out.extra[key] = sum(p.extra.get(key, 0.0) * p.clip_count for p in parts) / c
    return out
