"""The forward layout of the update: one choice, made here, of how a micro-batch goes through the decoder.

Three layouts compute the same completion hidden states (``HiddenFn``: ``logprobs.completion_hidden``'s
contract), up to summation order:

- unpadded (``loss/unpadded.py``): every row on its own, without padding or attention mask; the default;
- packed (``loss/packed.py``): the whole micro-batch as one sequence of real tokens, each prompt once;
- shared prompt (``shared_prompt.py``): each group's prompt forward once, its KV cache fanned out to the rows.

With ``memory.share_prompt_forward`` the packed layout is taken where ``packed.cheaper`` estimates less work,
else the shared-prompt one where the rows share prompts: for passes with gradients only where it also keeps
fewer bytes (``shared_prompt.applicable``), for passes without (old / reference log-probs, which keep no
activations) where it saves work and its peak (the completion pass's mask) is no larger than the plain pass's
(``shared_prompt.applicable_without_grad``), and not through a DDP / FSDP2 wrapper.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor, nn

from slimgrpo.loss import packed
from slimgrpo.loss.logprobs import CompletionRows, HeadSpec
from slimgrpo.loss.unpadded import unpadded_hidden
from slimgrpo.distributed.context import is_wrapped
from slimgrpo.update import shared_prompt
from slimgrpo.update.settings import UpdateSettings


class HiddenFn(Protocol):
    """``(hidden [n, H], targets [n], mask [rows, T] bool, head)`` of the completion tokens of padded rows."""

    def __call__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
                 completion_ids: Tensor, completion_mask: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, Tensor, HeadSpec]: ...


def forward(model, fn: Callable[..., Any], *args, **kwargs):
    """``fn(model, ...)``, through a DDP / FSDP2 wrapper's own forward when there is one (so that DDP syncs the
    gradients and FSDP2 gathers the root weights; see ``distributed.ModelForward``)."""
    if is_wrapped(model):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)


def unwrapped(model):
    """The causal LM inside a DDP / FSDP2 ``ModelForward`` wrapper (or the model itself)."""
    inner = getattr(model, "module", model)
    return getattr(inner, "model", inner) if is_wrapped(model) else model


def hidden_fn(model, input_ids: Tensor, attention_mask: Tensor, T: int, share_prompt: bool,
              with_grad: bool) -> HiddenFn:
    """The layout of one micro-batch (module docstring); ``with_grad``: the pass keeps activations for backward."""
    if not share_prompt:
        return unpadded_hidden  # rows re-laid without padding: no attention mask, no [rows, 1, S, S] tensor
    if is_wrapped(model):
        if not with_grad:
            return unpadded_hidden
        model = unwrapped(model)
    groups = (shared_prompt.applicable if with_grad else shared_prompt.applicable_without_grad)(
        model, input_ids, attention_mask, T)
    if packed.cheaper(model, input_ids, attention_mask, T, groups):
        return packed.packed_completion_hidden  # only real tokens, each prompt once, one sequence
    return shared_prompt.shared_completion_hidden if groups else unpadded_hidden


def run_layout(model, head: Callable[..., Any], input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor,
               settings: UpdateSettings, with_grad: bool, **kwargs):
    """``head`` (``completion_logprobs`` or the fused ``completion_loss``) over one micro-batch, in the layout
    ``hidden_fn`` picks, at the settings' temperature and token chunk, through the wrapper's ``forward``.
    ``kwargs``: the rest of ``head``'s arguments."""
    T = completion_ids.shape[1]
    layout = hidden_fn(model, input_ids, attention_mask, T, settings.share_prompt, with_grad)
    rows = CompletionRows(input_ids, attention_mask, T, completion_ids)
    return forward(model, head, rows, temperature=settings.temperature, token_chunk=settings.token_chunk,
                   hidden_fn=layout, **kwargs)
