"""The update's functions with the argument lists these tests were written against (model, batch, loss
settings, normaliser, then micro-batch rows, temperature, token / vocab chunk and the switches by name),
mapped onto ``slimgrpo.train.update``'s typed ``UpdateSettings``: the tests keep their calls, the library
keeps short parameter lists. Nothing here computes anything of its own."""

from __future__ import annotations

from slimgrpo.loss.objectives import LossSettings
from slimgrpo.train.update import UpdateBatch, gradients
from slimgrpo.train.update.settings import UpdateSettings

__all__ = ["UpdateBatch", "accumulate_gradients", "batch_logprobs"]


def _settings(loss: LossSettings | None, micro, temperature, token_chunk, vocab_chunk, **switches) -> UpdateSettings:
    return UpdateSettings(loss=loss if loss is not None else LossSettings(), micro_rows=micro,
                          temperature=temperature, token_chunk=token_chunk, vocab_chunk=vocab_chunk, **switches)


def accumulate_gradients(model, batch, settings, norm, micro, temperature, token_chunk, vocab_chunk,
                         loss_scale=1.0, no_sync=None, offload_activations=False, fuse=True, share_prompt=False,
                         micro_tokens=None, entropy_coef=None):
    s = _settings(settings, micro, temperature, token_chunk, vocab_chunk, micro_tokens=micro_tokens, fuse=fuse,
                  share_prompt=share_prompt, offload_activations=offload_activations)
    return gradients.accumulate_gradients(model, batch, s, norm, entropy_coef=entropy_coef, loss_scale=loss_scale,
                                          no_sync=no_sync)


def batch_logprobs(model, batch, micro, temperature, token_chunk, vocab_chunk, want_entropy=False,
                   micro_tokens=None, share_prompt=False):
    s = _settings(None, micro, temperature, token_chunk, vocab_chunk, micro_tokens=micro_tokens,
                  share_prompt=share_prompt)
    return gradients.batch_logprobs(model, batch, s, want_entropy=want_entropy)
