"""The forward layout of a micro-batch: one choice, made here (``choose_layout``), of how its rows go through
the decoder, and the one way into the model (``forward``).

Three layouts compute the same completion hidden states (``HiddenFn``: ``rows.completion_hidden``'s contract),
up to summation order:

- unpadded (``unpadded.py``): every row on its own, without padding or attention mask; the default;
- packed (``packed.py``): the whole micro-batch as one sequence of real tokens, each prompt once;
- shared prompt (``shared_prompt.py``): each group's prompt forward once, its KV cache fanned out to the rows.

With a ``PromptSharing`` (``memory.share_prompt_forward``) the packed layout is taken where ``packed.cheaper``
estimates less work, else the shared-prompt one where the rows share prompts and the model can run it
(``shared_prompt.shares_work``) and it is lighter (``PromptSharing.lighter``, from ``costs.py``): for passes
with gradients where it keeps fewer bytes, for passes without (old / reference log-probs, which keep no
activations) where its peak (the completion pass's mask) is no larger than the plain pass's, and never through
a DDP / FSDP2 wrapper for a pass without gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from torch import Tensor, nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.distributed.context import is_wrapped
from slimgrpo.forward import packed, shared_prompt
from slimgrpo.forward.costs import shared_prompt_lighter_without_grad, shared_prompt_saves
from slimgrpo.forward.rows import CompletionRows, HeadSpec
from slimgrpo.forward.unpadded import unpadded_hidden
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape


class HiddenFn(Protocol):
    """``(hidden [n, H], targets [n], mask [rows, T] bool, head)`` of the completion tokens of padded rows."""

    def __call__(self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
                 completion_ids: Tensor, completion_mask: Tensor | None = None
                 ) -> tuple[Tensor, Tensor, Tensor, HeadSpec]: ...


@dataclass(frozen=True)
class PromptSharing:
    """A model read once for the shared-prompt verdict (``memory.share_prompt_forward``). ``shape`` None: a
    config without the usual keys (no cost model), which shares wherever the rows share a prompt."""

    shape: ModelShape | None = None
    param_bytes: int = 2  # bytes of a parameter as the planner counts them (4: fp32, else 2)
    attn: str = "sdpa"  # the model's attention implementation

    @classmethod
    def of(cls, model: Any) -> PromptSharing:
        """The verdict's view of ``model`` (a causal LM, peft-wrapped or not)."""
        lm = unwrap_causal_lm(model)
        try:
            shape = ModelShape.from_hf_config(lm.config.to_dict())
        except (ValueError, KeyError, TypeError):
            return cls(shape=None)
        param = next(lm.parameters(), None)
        B = 4 if param is None or param.element_size() >= 4 else 2
        return cls(shape, B, getattr(lm.config, "_attn_implementation", None) or "sdpa")

    def lighter(self, rows: int, groups: int, P: int, T: int, prompt_padded: bool, with_grad: bool) -> bool:
        """Whether sharing ``groups`` prompts of ``P`` tokens among ``rows`` completions of ``T`` is lighter:
        with gradients, it keeps fewer bytes than the plain update (``costs.shared_prompt_saves``); without (old /
        reference log-probs keep nothing for backward), its peak is no larger than the plain pass's
        (``costs.shared_prompt_lighter_without_grad``). The spec it asks about is this model's micro-batch on
        its own (CPU, full fine-tuning, the model's dtype and attention), whatever the run's other settings."""
        if self.shape is None:
            return True
        x = RunSpec(device="cpu", param_dtype_bytes=self.param_bytes, num_generations=rows, micro_batch_rows=rows,
                    max_prompt_length=P, max_completion_length=T, attn_implementation=self.attn)
        if with_grad:
            return shared_prompt_saves(x, groups, self.shape, prompt_padded=prompt_padded)
        return shared_prompt_lighter_without_grad(self.shape, x, groups, prompt_padded=prompt_padded)


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


def choose_layout(model, rows: CompletionRows, sharing: PromptSharing | None, with_grad: bool) -> HiddenFn:
    """The layout of one micro-batch's ``rows`` (module docstring); ``sharing``: the verdict's view of the model
    (None: ``memory.share_prompt_forward`` is off, every row unpadded); ``with_grad``: the pass keeps activations
    for backward."""
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
    run it (``shares_work``) and it is lighter (``sharing.lighter``), else 0."""
    ids, am, T = rows.input_ids, rows.attention_mask, rows.T
    groups = shared_prompt.shares_work(model, ids, am, T)
    if not groups:
        return 0
    P = ids.shape[1] - T
    padded = bool((am[:, :P] == 0).any())
    return groups if sharing.lighter(ids.shape[0], groups, P, T, prompt_padded=padded, with_grad=with_grad) else 0


__all__ = ["HiddenFn", "PromptSharing", "choose_layout", "forward", "shared_groups", "unwrapped"]
