"""Adaptive entropy control (Skywork-OR1, He et al., arXiv:2505.22312, sec. 3.2), as in TRL 1.16.

The entropy bonus ``-c * mean H`` (``objectives.entropy_bonus``) has a coefficient ``c`` that, with
``use_adaptive_entropy``, moves by ``delta`` once per optimizer step from the mean entropy ``H*`` of
the tokens the bonus acted on during that step (all micro-batches, all ranks, token-weighted)::

    c <- min(c + delta, c_max)   if H* <= target
    c <- max(c - delta, c_min)   otherwise

The coefficient applied during a step is ``c`` if the entropy measured at the end of the previous
step was ``<= target``, else 0 (and 0 before the first measurement): the bonus only acts once the
entropy has fallen to the target.  Without adaptive control ``c`` is fixed and always applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class EntropyController:
    coef: float  # loss.entropy_coef: the current coefficient (initial value when adaptive)
    adaptive: bool = False  # loss.use_adaptive_entropy
    coef_min: float = 0.0
    coef_max: float = 1.0
    delta: float = 0.005
    target: float = 0.2
    last_entropy: float = math.inf  # H* of the last optimizer step; inf before the first one

    @classmethod
    def from_config(cls, loss_cfg) -> EntropyController:
        """From the ``loss`` section (``config.loss.LossConfig``)."""
        return cls(coef=float(loss_cfg.entropy_coef), adaptive=bool(loss_cfg.use_adaptive_entropy),
                   coef_min=float(loss_cfg.entropy_coef_min), coef_max=float(loss_cfg.entropy_coef_max),
                   delta=float(loss_cfg.entropy_coef_delta), target=float(loss_cfg.entropy_target))

    def applied(self) -> float:
        """The coefficient every micro-batch of the coming optimizer step uses."""
        if self.adaptive and not self.last_entropy <= self.target:
            return 0.0
        return self.coef

    def update(self, entropy_sum: float, tokens: float) -> None:
        """After an optimizer step: ``entropy_sum`` / ``tokens`` over the tokens the bonus acted on
        (summed over micro-batches and ranks).  A no-op without adaptive control."""
        if not self.adaptive:
            return
        entropy = entropy_sum / max(tokens, 1.0)
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for checkpoints (the infinite ``last_entropy`` as None)."""
        last = None if math.isinf(self.last_entropy) else self.last_entropy
        return {"entropy_coef": self.coef, "last_entropy": last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.adaptive or not state:  # a fixed coefficient comes from the config, as in TRL
            return
        self.coef = float(state["entropy_coef"])
        last = state.get("last_entropy")
        self.last_entropy = math.inf if last is None else float(last)
