"""The update's functions with the argument lists these tests were written against (model, batch, loss
settings, normaliser, then micro-batch rows, temperature, token / vocab chunk and the switches by name),
mapped onto ``slimgrpo.update``'s typed ``UpdateSettings``: the tests keep their calls, the library
keeps short parameter lists. Nothing here computes anything of its own; ``tiny_update_case`` is the small
ragged batch on the tiny model that several update tests share."""

from __future__ import annotations

import torch

from slimgrpo.loss.objectives import LossSettings
from slimgrpo.update import UpdateBatch
from slimgrpo.update import gradients
from slimgrpo.forward.layout import PromptSharing
from slimgrpo.update.settings import UpdateSettings

__all__ = ["UpdateBatch", "accumulate_gradients", "batch_logprobs", "grads_at_optimizer_step", "tiny_update_case"]


def tiny_update_case(tiny_model_dir, short_last_row: bool = False, with_ref: bool = False):
    """``(model, batch)``: the tiny model in float32 and 5 rows of a 4-token prompt + 7 completion tokens (seed
    5), row 1 left-padded by 2, row 3 ending 2 early (and row 4 ending 5 early with ``short_last_row``), random
    advantages, and with ``with_ref`` reference log-probs around -6."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    rows, P, Tc = 5, 4, 7
    ids = torch.randint(0, model.config.vocab_size, (rows, P + Tc), generator=g)
    am = torch.ones_like(ids)
    am[1, :2] = 0
    am[3, -2:] = 0
    if short_last_row:
        am[4, -5:] = 0
    advantages = torch.randn(rows, generator=g)
    ref = -6.0 + torch.randn(rows, Tc, generator=g) if with_ref else None
    return model, UpdateBatch(ids, am, ids[:, -Tc:], am[:, -Tc:].bool(), advantages, ref_logp=ref)


def _settings(loss: LossSettings | None, micro, temperature, token_chunk, vocab_chunk, **switches) -> UpdateSettings:
    """``share_prompt`` (True / False here) becomes the model's ``PromptSharing`` (the planner's view, read once
    as ``UpdateSettings.from_config`` reads it) or None."""
    model = switches.pop("model", None)
    if switches.get("share_prompt"):
        switches["share_prompt"] = PromptSharing.of(model)
    else:
        switches["share_prompt"] = None
    return UpdateSettings(loss=loss if loss is not None else LossSettings(), micro_rows=micro,
                          temperature=temperature, token_chunk=token_chunk, vocab_chunk=vocab_chunk, **switches)


def accumulate_gradients(model, batch, settings, norm, micro, temperature, token_chunk, vocab_chunk,
                         loss_scale=1.0, no_sync=None, offload_activations=False, fuse=True, share_prompt=False,
                         micro_tokens=None, entropy_coef=None):
    s = _settings(settings, micro, temperature, token_chunk, vocab_chunk, micro_tokens=micro_tokens, fuse=fuse,
                  share_prompt=share_prompt, offload_activations=offload_activations, model=model)
    return gradients.accumulate_gradients(model, batch, s, norm, entropy_coef=entropy_coef, loss_scale=loss_scale,
                                          no_sync=no_sync)


def batch_logprobs(model, batch, micro, temperature, token_chunk, vocab_chunk, want_entropy=False,
                   micro_tokens=None, share_prompt=False):
    s = _settings(None, micro, temperature, token_chunk, vocab_chunk, micro_tokens=micro_tokens,
                  share_prompt=share_prompt, model=model)
    return gradients.batch_logprobs(model, batch, s, want_entropy=want_entropy)


def grads_at_optimizer_step(runner) -> dict[str, torch.Tensor]:
    """Patch ``runner``'s (``trace.synthetic.UpdateOnly``) optimizer step to copy every ``.grad`` into the dict
    returned, as the step sees them (the update frees them before it returns)."""
    seen: dict[str, torch.Tensor] = {}
    original = runner.updater.optimizer.step

    def capture(*a, **k):
        seen.update({n: p.grad.clone() for n, p in runner.model.named_parameters() if p.grad is not None})
        return original(*a, **k)

    runner.updater.optimizer.step = capture
    return seen
