"""The forward layout of the update: one choice, made here, of how a micro-batch goes through the decoder
(``choose_layout``), and the one way into the model (``forward``).

Three layouts, all in ``loss/``, compute the same completion hidden states (``HiddenFn``:
``loss.logprobs.completion_hidden``'s contract), up to summation order:

- unpadded (``loss/unpadded.py``): every row on its own, without padding or attention mask; the default;
- packed (``loss/packed.py``): the whole micro-batch as one sequence of real tokens, each prompt once;
- shared prompt (``loss/shared_prompt.py``): each group's prompt forward once, its KV cache fanned out to the rows.

With ``settings.share_prompt`` (``memory.share_prompt_forward``) the packed layout is taken where
``packed.cheaper`` estimates less work, else the shared-prompt one where the rows share prompts and the model
can run it (``shared_prompt.shares_work``) and the planner finds it lighter (``plan.prompt_sharing``, read from
the model once in ``settings.py``): for passes with gradients where it keeps fewer bytes, for passes without (old /
reference log-probs, which keep no activations) where its peak (the completion pass's mask) is no larger than
the plain pass's, and never through a DDP / FSDP2 wrapper for a pass without gradients.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import Tensor, nn

from slimgrpo.distributed.context import is_wrapped
from slimgrpo.loss import packed, shared_prompt
from slimgrpo.loss.logprobs import CompletionRows, HeadSpec
from slimgrpo.loss.unpadded import unpadded_hidden
from slimgrpo.plan.prompt_sharing import PromptSharing
from slimgrpo.update.settings import UpdateSettings


class HiddenFn(Protocol):
    """``(hidden [n, H], targets [n], mask [rows, T] bool, head)`` of the completion tokens of padded rows."""

    def __call__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
                 completion_ids: Tensor, completion_mask: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, Tensor, HeadSpec]: ...


def forward(model, fn: Callable[..., Any], *args, **kwargs):
    """``fn(model, ...)``, through a DDP / FSDP2 wrapper's own forward when there is one (so that DDP syncs the
    gradients and FSDP2 gathers the root weights; see ``distributed.ModelForward``): the decoder, the LM head
    and, on the fused path, the loss all run inside it."""
    if is_wrapped(model):
        return model(fn, *args, **kwargs)
    return fn(model, *args, **kwargs)


def unwrapped(model):
    """The causal LM inside a DDP / FSDP2 ``ModelForward`` wrapper (or the model itself)."""
    inner = getattr(model, "module", model)  # DDP's module, or FSDP2's root itself: a ModelForward
    return inner.model if is_wrapped(model) else model


def choose_layout(model, rows: CompletionRows, settings: UpdateSettings, with_grad: bool) -> HiddenFn:
    """The layout of one micro-batch's ``rows`` (module docstring); ``with_grad``: the pass keeps activations
    for backward."""
    sharing = settings.share_prompt
    if sharing is None:
        return unpadded_hidden  # rows re-laid without padding: no attention mask, no [rows, 1, S, S] tensor
    if is_wrapped(model):
        if not with_grad:
            return unpadded_hidden
        model = unwrapped(model)
    groups = shared_groups(model, rows, sharing, with_grad)
    if packed.cheaper(model, rows.input_ids, rows.attention_mask, rows.T, groups):
        return packed.packed_completion_hidden  # only real tokens, each prompt once, one sequence
    return shared_prompt.shared_completion_hidden if groups else unpadded_hidden


def shared_groups(model, rows: CompletionRows, sharing: PromptSharing, with_grad: bool) -> int:
    """The number of groups the shared-prompt layout runs ``rows`` as: where it saves work and the model can
    run it (``shares_work``) and the planner finds it lighter (``sharing.lighter``), else 0."""
    ids, am, T = rows.input_ids, rows.attention_mask, rows.T
    groups = shared_prompt.shares_work(model, ids, am, T)
    if not groups:
        return 0
    P = ids.shape[1] - T
    padded = bool((am[:, :P] == 0).any())
    return groups if sharing.lighter(ids.shape[0], groups, P, T, prompt_padded=padded, with_grad=with_grad) else 0
