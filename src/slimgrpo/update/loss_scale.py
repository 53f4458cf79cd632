"""Dynamic loss scaling for a float16 policy (LoRA or QLoRA on float16 weights, e.g. a GPU without bfloat16).

The adapters train in float32, but backward runs through the float16 base: the gradients of the hidden states
are float16, and a GRPO loss averaged over many tokens makes them small enough to underflow. Measured on CPU
(a 2-layer Llama, LoRA r 8, 8 completions x 4,096 tokens, ``dapo``): the adapters' gradients were 36% off the
float32 model's (cosine 0.94); with the loss scaled by 1,024 before backward and the gradients divided by it
after, 0.1% (docs/memory.md#float16).

    scale = LossScale.for_model(model)          # inactive (scale 1) unless a parameter is float16
    loss_scale = world_size * scale.value        # what backward multiplies the loss by
    scale.unscale(params)                        # the gradients one unscaled backward would give
    if not finite(grad_norm) and scale.overflowed():  # halved: run the backward again
    scale.stepped()                              # after an optimizer step: doubles every GROWTH_INTERVAL

The decisions follow the global gradient norm (the same on every rank), so every rank keeps the same scale.
An overflow re-runs the slice's backward at half the scale instead of skipping the update (a skipped update
would count towards ``run.max_nonfinite_steps``). Same rule as mixed-precision loss scalers (start high, halve
on overflow, double after a run of clean steps), kept here because the retry and the cross-rank decision do not
fit ``torch.amp.GradScaler``'s per-rank ``found_inf``.
"""

from __future__ import annotations

from typing import Any

import torch

INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 100  # clean optimizer steps before the scale doubles (RL runs are hundreds of steps, not 1e5)
MIN_SCALE = 1.0


class LossScale:
    """The loss scale of a float16 policy; ``active=False`` keeps it at 1 and every method a no-op."""

    def __init__(self, active: bool, value: float = INITIAL_SCALE) -> None:
        self.active = active
        self.value = value if active else 1.0
        self.clean_steps = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> LossScale:
        """Active when any parameter of ``model`` is float16 (the base the gradients flow through)."""
        return cls(any(p.dtype == torch.float16 for p in model.parameters()))

    def unscale(self, params: list[torch.nn.Parameter]) -> None:
        """Divide every gradient by the scale: what a backward of the unscaled loss gives (in float32)."""
        if not self.active or self.value == 1.0:
            return
        inv = 1.0 / self.value
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(inv)

    def overflowed(self) -> bool:
        """A non-finite gradient norm at this scale: halve it. True when the backward should run again (the
        scale was above ``MIN_SCALE``); False: the overflow is not the scale's (inactive, or already at 1)."""
        if not self.active or self.value <= MIN_SCALE:
            return False
        self.value = max(self.value / 2, MIN_SCALE)
        self.clean_steps = 0
        return True

    def stepped(self) -> None:
        """One optimizer step with finite gradients: after ``GROWTH_INTERVAL`` in a row the scale doubles."""
        if not self.active:
            return
        self.clean_steps += 1
        if self.clean_steps >= GROWTH_INTERVAL:
            self.value *= 2
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "clean_steps": self.clean_steps} if self.active else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.active and state:
            self.value = float(state["value"])
            self.clean_steps = int(state["clean_steps"])
