"""The rows a forward pass takes and what it hands the LM head.

``CompletionRows``: padded rows whose last ``T`` columns are the completions (left-padded prompt, right-padded
completion), the one input of every forward layout. A layout (``hidden_layout``: the padded one here,
``unpadded.py``, ``packed.py``, ``shared_prompt.py``) runs the decoder and returns ``(hidden [n, H], targets [n],
mask [rows, T] bool, head)``: the final hidden states that predict the ``n`` scored completion tokens, those
tokens, where they sit, and the LM head (``lm_head_spec``) the loss's chunked kernels take them through
(``forward/passes.py``).

The LM head of a causal LM is read by ``lm_head_spec``; besides its weight (and bias) a few model
families transform the logits, and these config fields are honoured:

    ===========================  =====================  ====================================
    config field                 families               effect on the head output ``a``
    ===========================  =====================  ====================================
    ``logit_scale``              Cohere, Cohere2        ``a * logit_scale``
    ``logits_scaling``           Granite, GraniteMoE    ``a / logits_scaling``
    ``final_logit_softcapping``  Gemma 2, Gemma 3       ``cap * tanh(a / cap)`` (after scale)
    ===========================  =====================  ====================================

Any other head-side transform a model family applies in its ``forward`` is not seen here; the
tests compare the result against ``model(...).logits`` for the families above and for Qwen2.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.loss.chunked_head import HeadSpec

__all__ = ["CompletionRows", "HeadSpec", "HiddenOut", "completion_hidden", "completion_position_ids",
           "hidden_layout", "layout_hidden", "lm_head_spec"]


def _text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; pass a Hugging Face causal LM")
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def _active_head(head: nn.Module) -> nn.Module:
    """Resolves peft wrappers around the LM head to the module whose weight is in use."""
    if hasattr(head, "modules_to_save") and hasattr(head, "original_module"):
        # peft ModulesToSaveWrapper (``modules_to_save=["lm_head"]``): a trainable copy per adapter.
        if getattr(head, "disable_adapters", False):
            return head.original_module
        active = head.active_adapters
        return head.modules_to_save[active[0]] if active else head.original_module
    if hasattr(head, "base_layer"):
        raise ValueError(
            "the LM head carries a LoRA adapter, which the chunked head cannot apply; leave "
            "'lm_head' out of LoraConfig.target_modules (use modules_to_save=['lm_head'] to train "
            "it fully)"
        )
    return head


def lm_head_spec(model: nn.Module) -> HeadSpec:
    """Reads the LM head of any Hugging Face causal LM (peft-wrapped or not).

    Weight and bias come from ``get_output_embeddings()``; the logit transform from the (text)
    config: ``logit_scale`` (Cohere), ``logits_scaling`` (Granite, divides) and
    ``final_logit_softcapping`` (Gemma 2/3).  Call it each time it is needed rather than caching
    it: with peft ``modules_to_save`` the active head changes when adapters are disabled.
    """
    lm = unwrap_causal_lm(model)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(lm).__name__} has no output embeddings (LM head); pass a "
                         "causal LM such as AutoModelForCausalLM, not a bare backbone")
    head = _active_head(head)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"LM head {type(head).__name__} has no [vocab, hidden] weight")
    config = _text_config(lm)
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    granite = getattr(config, "logits_scaling", None)
    if granite:
        scale /= float(granite)
    softcap = getattr(config, "final_logit_softcapping", None)
    return HeadSpec(weight=weight, bias=getattr(head, "bias", None), logit_scale=scale,
                    softcap=float(softcap) if softcap else None)


def completion_position_ids(attention_mask: Tensor) -> Tensor:
    """Position of each token counted over real tokens only: ``cumsum(mask) - 1``, clamped at 0.

    ``attention_mask`` [rows, L] -> [rows, L] long.  A left-padded prompt then starts at 0.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def _check_completion_inputs(input_ids: Tensor, attention_mask: Tensor, num_tokens: int,
                             completion_ids: Tensor, completion_mask: Tensor | None) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids and attention_mask must both be [rows, P + T], got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    if not 1 <= num_tokens < input_ids.shape[1]:
        raise ValueError(f"num_completion_tokens must be in [1, {input_ids.shape[1] - 1}] (a "
                         f"prompt token is needed to predict the first one), got {num_tokens}")
    expected = (input_ids.shape[0], num_tokens)
    if tuple(completion_ids.shape) != expected:
        raise ValueError(f"completion_ids must be [rows, T] = {list(expected)}, got "
                         f"{tuple(completion_ids.shape)}")
    if completion_mask is not None and tuple(completion_mask.shape) != expected:
        raise ValueError(f"completion_mask must be [rows, T] = {list(expected)}, got "
                         f"{tuple(completion_mask.shape)}")


@dataclass(frozen=True)
class CompletionRows:
    """Padded rows whose last ``T`` columns are the completions: what ``completion_logprobs`` and the fused
    ``completion_loss`` score, and what every forward layout takes (``completion_hidden``'s arguments,
    checked by ``hidden_layout`` before a layout sees them)."""

    input_ids: Tensor  # [rows, P + T] left-padded prompt, then right-padded completion
    attention_mask: Tensor  # [rows, P + T]
    T: int
    completion_ids: Tensor  # [rows, T] the targets
    completion_mask: Tensor | None = None  # [rows, T] the tokens to score; None: attention_mask[:, -T:]

    @property
    def mask(self) -> Tensor:
        """``[rows, T]`` bool: the scored completion tokens."""
        return (self.attention_mask[:, -self.T:] if self.completion_mask is None else self.completion_mask).bool()


HiddenOut = tuple[Tensor, Tensor, Tensor, HeadSpec]  # (hidden [n, H], targets [n], mask [rows, T] bool, head)


def hidden_layout(fn: Callable[[nn.Module, CompletionRows], HiddenOut]) -> Callable[..., HiddenOut]:
    """A forward layout ``fn(model, rows)`` with ``completion_hidden``'s calling convention (``HiddenFn`` in
    forward/layout.py), its arguments checked here once for every layout that takes padded rows."""

    def hidden_fn(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, num_completion_tokens: int,
                  completion_ids: Tensor, completion_mask: Tensor | None = None) -> HiddenOut:
        _check_completion_inputs(input_ids, attention_mask, num_completion_tokens, completion_ids, completion_mask)
        return fn(model, CompletionRows(input_ids, attention_mask, num_completion_tokens, completion_ids,
                                        completion_mask))

    hidden_fn.__name__, hidden_fn.__qualname__, hidden_fn.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    hidden_fn.__module__ = fn.__module__
    return hidden_fn


@hidden_layout
def completion_hidden(model: nn.Module, x: CompletionRows) -> HiddenOut:
    """The backbone half of ``completion_logprobs`` (same arguments, ``hidden_layout``).

    Returns ``(hidden [n, H], targets [n], mask [rows, T] bool, head)``: the final hidden states that
    predict the ``n`` scored completion tokens, those tokens, where they sit, and the LM head.
    """
    T = x.T
    lm = unwrap_causal_lm(model)
    decoder = lm.get_decoder()
    out = decoder(input_ids=x.input_ids, attention_mask=x.attention_mask,
                  position_ids=completion_position_ids(x.attention_mask), use_cache=False)
    hidden = out[0][:, -T - 1 : -1]  # [rows, T, H]
    mask = x.mask
    return hidden[mask], x.completion_ids[mask], mask, lm_head_spec(lm)


def layout_hidden(model: nn.Module, rows: CompletionRows, hidden_fn=None) -> HiddenOut:
    """``hidden_fn`` (default ``completion_hidden``) of ``rows``, called with its fields in
    ``completion_hidden``'s order: ``(hidden [n, H], targets [n], mask [rows, T] bool, head)``."""
    return (hidden_fn or completion_hidden)(model, rows.input_ids, rows.attention_mask, rows.T,
                                            rows.completion_ids, rows.completion_mask)


