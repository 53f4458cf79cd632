"""The plan's lines for PPO's critic (update/critic.py): a second adapter or model, its gradients, optimizer
state and per-token value buffers."""

from __future__ import annotations

import math

from slimgrpo.plan.formulas import (ADAMW_8BIT_BYTES_PER_PARAM, ADAMW_STATES, LORA_ADAPTER_BYTES, MASTER_WEIGHT_BYTES,
                                    _n, fp32_master, lora_num_params)
from slimgrpo.plan.shapes import ModelShape
from slimgrpo.plan.types import Component, PlanInputs


def critic_components(shape: ModelShape, x: PlanInputs) -> list[Component]:
    """PPO's critic (update/critic.py): its weights, gradients, optimizer state and per-token buffers. Its
    forward and backward run after the policy's backward has freed its activations, and keep no more than
    the policy's (no LM head): they add no line of their own."""
    if not x.ppo:
        return []
    head = (shape.hidden + 1) * 4  # Linear(hidden, 1) in fp32
    if x.lora:
        n, b = lora_num_params(shape, x.lora_rank, x.lora_target_modules), LORA_ADAPTER_BYTES
        weights = Component("critic adapter + value head", n * b + head, "always",
                            f"a second LoRA adapter on the same base, L·Σ r·(in+out)·{b} B + (H+1)·4 = "
                            f"{_n(n)}·{b} + {_n(head)}")
    else:
        n, b = shape.num_params, x.param_dtype_bytes
        weights = Component("critic model + value head", n * b + head, "always",
                            f"full fine-tuning: a second model (critic.model_path, assumed the policy's shape), "
                            f"N·{b} B + (H+1)·4 = {_n(n)}·{b} + {_n(head)}")
    grads = Component("critic gradients", n * b + head, "update", f"{_n(n)}·{b} + {_n(head)}")
    master = fp32_master(x)  # a full-fine-tuning critic shares the policy's optimizer and its rule
    if master:
        state = Component("critic optimizer state", (n * MASTER_WEIGHT_BYTES + head) * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} float32 moments (master weights): "
                          f"({_n(n)}·{MASTER_WEIGHT_BYTES} + {_n(head)})·{ADAMW_STATES}")
    elif x.optimizer == "adamw":
        state = Component("critic optimizer state", (n * b + head) * ADAMW_STATES, "always",
                          f"AdamW, {ADAMW_STATES} moments: ({_n(n)}·{b} + {_n(head)})·{ADAMW_STATES}")
    else:
        state = Component("critic optimizer state", math.ceil(n * ADAMW_8BIT_BYTES_PER_PARAM) + head * ADAMW_STATES,
                          "always", f"8-bit AdamW: {_n(n)}·{ADAMW_8BIT_BYTES_PER_PARAM:.3f} B + head")
    rows, T = x.rows, x.max_completion_length
    buffers = Component("value buffers", 4 * rows * T * 4, "always",
                        f"old values, returns, advantages, token rewards [rows, T] fp32: 4·{rows}·{T}·4")
    out = [weights, grads, state, buffers]
    if master:
        out.append(Component("critic fp32 master weights", n * MASTER_WEIGHT_BYTES, "always",
                             f"a float32 copy of each critic weight, {_n(n)}·{MASTER_WEIGHT_BYTES} B"))
    return out
