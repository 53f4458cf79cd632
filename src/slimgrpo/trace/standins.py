"""Stand-ins for the CUDA-only pieces a trace cannot run on CPU: bitsandbytes' 4-bit base and 8-bit AdamW.

Each keeps the tensors the real one keeps, at the real sizes, and the working set of its kernel:

* :class:`NF4Linear` stores a frozen projection as bitsandbytes NF4 with double quantisation does:
  packed 4-bit weights (``ceil(n/2)`` bytes), one 8-bit absmax per 64 weights, one fp32 absmax per
  256 blocks (plus its 256-entry fp32 code). Its matmul dequantises the weight to the compute dtype,
  multiplies and frees it, in forward and again in backward; nothing of the weight is saved for
  backward (bitsandbytes' ``MatMul4Bit`` does the same).
* :class:`AdamW8bitStandIn` keeps two uint8 moments per parameter and one fp32 absmax per block of
  256 (bitsandbytes' blockwise 8-bit state); its step updates in place, as the fused CUDA kernel does,
  with no temporaries. What it computes is not AdamW: only its memory is.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from slimgrpo.runspec.cost import LORA_MODULES

NF4_BLOCK, NF4_NESTED_BLOCK, ADAM8_BLOCK = 64, 256, 256


class _Dequantised(torch.autograd.Function):
    """``x @ W.t()`` with ``W`` rebuilt from its 4-bit storage in forward and again in backward."""

    @staticmethod
    def forward(ctx, x, packed, out_features, in_features):
        ctx.shape = (out_features, in_features, packed)
        w = torch.empty(out_features, in_features, dtype=x.dtype, device=x.device)  # dequantised weight
        return x @ w.t()

    @staticmethod
    def backward(ctx, grad):
        out_features, in_features, _ = ctx.shape
        w = torch.empty(out_features, in_features, dtype=grad.dtype, device=grad.device)
        return grad @ w, None, None, None


class NF4Linear(nn.Linear):
    """A frozen linear layer stored as NF4 (see the module docstring); peft wraps it like any ``nn.Linear``."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        n, device = linear.in_features * linear.out_features, linear.weight.device
        blocks = math.ceil(n / NF4_BLOCK)
        self.weight = nn.Parameter(torch.empty(math.ceil(n / 2), dtype=torch.uint8, device=device),
                                   requires_grad=False)
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
        self.register_buffer("nested_absmax", torch.empty(math.ceil(blocks / NF4_NESTED_BLOCK), device=device))
        self.register_buffer("nested_code", torch.empty(256, device=device))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Dequantised.apply(x, self.weight, self.out_features, self.in_features)
        return y + self.bias if self.bias is not None else y


def quantize_standin(model: nn.Module) -> nn.Module:
    """Replace the seven projections of every decoder layer by :class:`NF4Linear` (in place)."""
    for module in list(model.modules()):
        for name in LORA_MODULES:
            child = getattr(module, name, None)
            if type(child) is nn.Linear:
                setattr(module, name, NF4Linear(child))
    return model


class AdamW8bitStandIn(torch.optim.Optimizer):
    """The memory of bitsandbytes' ``AdamW8bit`` (see the module docstring)."""

    def __init__(self, params, lr: float = 1e-6) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    blocks = math.ceil(p.numel() / ADAM8_BLOCK)
                    state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                    state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                    state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                    state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                p.add_(p.grad, alpha=-group["lr"])  # in place, like the fused kernel
        return None
