"""The Hugging Face causal LM under an optional peft wrapper: the one unwrap every floor uses.

peft injects its LoRA layers into the base model in place, so running the unwrapped model's modules still
runs the adapters (and ``PeftModel.disable_adapter()`` still switches them off): the loss reads the decoder
and the LM head there, the planner, the wrappers and the checkpoints read its config and parameters. A
foundation (it imports nothing from slimgrpo), so the loss below the model loader can reach it too.
"""

from __future__ import annotations

from typing import Any


def is_peft(model: Any) -> bool:
    """A peft ``PeftModel`` (it can switch its adapters off and hands out its base model)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def unwrap_causal_lm(model: Any) -> Any:
    """The transformers causal LM inside ``model`` (``model`` itself when it is not a peft wrapper)."""
    return model.get_base_model() if is_peft(model) else model


__all__ = ["is_peft", "unwrap_causal_lm"]
