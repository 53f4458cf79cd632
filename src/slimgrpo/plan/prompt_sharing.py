"""The planner's verdict on sharing prompts in the update (``memory.share_prompt_forward``), for one model.

The update runs each group's prompt once where the rows share it (``loss/shared_prompt.py``), but only where
that is lighter than the plain pass: the completion pass attends through a [rows, 1, T, P + T] mask (and
sdpa then repeats keys and values to query width), so long completions after a short prompt cost more
shared than plain. ``PromptSharing.of(model)`` reads the model's side of that verdict once (the update's
settings hold it, ``update/settings.py``); ``lighter`` then answers for one micro-batch's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimgrpo.plan.planner import shared_prompt_lighter_without_grad, shared_prompt_saves
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.types import PlanInputs


@dataclass(frozen=True)
class PromptSharing:
    """The planner's reading of a model for the shared-prompt verdict. ``shape`` None: a config the planner
    cannot read (an architecture without the usual keys), which shares wherever the rows share a prompt."""

    shape: ModelShape | None = None
    param_bytes: int = 2  # bytes of a parameter as the planner counts them (4: fp32, else 2)
    attn: str = "sdpa"  # the model's attention implementation

    @classmethod
    def of(cls, model: Any) -> PromptSharing:
        """The verdict's view of ``model`` (a causal LM, peft-wrapped or not)."""
        from slimgrpo.causal_lm import unwrap_causal_lm

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
        with gradients, it keeps fewer bytes than the plain update (``shared_prompt_saves``); without (old /
        reference log-probs keep nothing for backward), its peak is no larger than the plain pass's
        (``shared_prompt_lighter_without_grad``)."""
        if self.shape is None:
            return True
        x = PlanInputs(device="cpu", param_dtype_bytes=self.param_bytes, num_generations=rows, micro_batch_rows=rows,
                       max_prompt_length=P, max_completion_length=T, attn_implementation=self.attn)
        if with_grad:
            return shared_prompt_saves(x, groups, self.shape, prompt_padded=prompt_padded)
        return shared_prompt_lighter_without_grad(self.shape, x, groups, prompt_padded=prompt_padded)


__all__ = ["PromptSharing"]
