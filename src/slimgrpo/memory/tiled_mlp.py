"""Tiled MLP: each decoder layer's MLP runs a shard of the tokens at a time, under its own recompute.

The gated MLP of a Llama-style layer, ``down(act(gate(x)) * up(x))``, works token by token, so it can be
run on a slice of the tokens without changing any value. For a micro-batch of ``N`` tokens (all rows,
flattened) its intermediates are ``N x intermediate`` per tensor: 12,288 x 131,072 values each for Qwen3-8B
at its whole window. Tiled, the tokens are cut into ``ceil(N / hidden)`` shards (so one shard's
intermediates are no larger than a ``hidden x intermediate`` weight) and:

* forward: each shard goes through the MLP with nothing saved for backward; only the MLP's input is kept;
* backward: each shard is run again with autograd on, and ``torch.autograd.backward`` is called on its
  output with its slice of the incoming gradient. Whatever parameters require a gradient (the full MLP,
  peft's LoRA adapters on gate / up / down, none) get it accumulated shard by shard into ``.grad``, and
  the input's gradient is written slice by slice.

So one shard's intermediates are alive at a time in forward and backward, at the cost of one more MLP
forward per layer. The idea is that of Snowflake's Arctic Long Sequence Training (arXiv 2506.13996,
"TiledMLP"); this is our own code. Without a gradient (rollout, reference log-probs) the shards run one
after the other under ``no_grad``. An MLP with dropout active is left alone: the recompute would draw
different masks.

    report = tile_mlps(model)           # patches every known decoder MLP's forward in place
    report.tiled, report.unknown        # how many were tiled; class names the tiler does not know
    untile_mlps(model)                  # back to the original forwards
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field

import torch


# MLP classes whose forward is token-wise (a gated MLP with no state across tokens): safe to shard.
KNOWN_MLP_CLASSES = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")
_UNTILED = "_slimgrpo_untiled_forward"
_SHARD_TOKENS = "_slimgrpo_shard_tokens"


def shard_count(tokens: int, shard_tokens: int) -> int:
    """Shards for ``tokens`` tokens of at most ``shard_tokens`` each: ceil(tokens / shard_tokens), >= 1."""
    return max(1, math.ceil(tokens / max(1, shard_tokens)))


def shard_bounds(tokens: int, shards: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each shard: equal sizes ceil(tokens / shards), the last one shorter."""
    size = math.ceil(tokens / max(1, shards)) if tokens else 1
    return [(s, min(s + size, tokens)) for s in range(0, tokens, size)]


# The planner reads the same function (update/costs.py), so the plan and the tiler cannot disagree.
def tiled_shard_tokens(tokens: int, hidden: int) -> int:
    """Tokens of the largest shard when ``tokens`` are cut into ceil(tokens / hidden) shards (<= hidden)."""
    if tokens <= 0:
        return 0
    return math.ceil(tokens / max(1, math.ceil(tokens / max(1, hidden))))


shard_tokens_of = tiled_shard_tokens


class _TiledMLP(torch.autograd.Function):
    """``forward(x, mlp_forward, shards)``: the MLP shard by shard, saving only ``x``; backward recomputes
    each shard under autograd and back-propagates through it (parameter gradients accumulate in ``.grad``)."""

    @staticmethod
    def forward(ctx, x, mlp_forward, shards):
        ctx.mlp_forward, ctx.shards = mlp_forward, shards
        ctx.save_for_backward(x)
        return _sharded(x, mlp_forward, shards)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        flat = x.reshape(-1, x.shape[-1])
        grads = grad_out.reshape(flat.shape[0], -1)
        want_x = ctx.needs_input_grad[0]
        grad_x = torch.empty_like(flat) if want_x else None
        for a, b in shard_bounds(flat.shape[0], ctx.shards):
            with torch.enable_grad():
                piece = flat[a:b].detach().requires_grad_(want_x)
                out = ctx.mlp_forward(piece)
            if out.requires_grad:
                torch.autograd.backward(out, grads[a:b])
            if want_x:
                grad_x[a:b] = piece.grad if piece.grad is not None else 0
            del piece, out
        return (grad_x.view_as(x) if want_x else None), None, None


def _sharded(x: torch.Tensor, mlp_forward, shards: int) -> torch.Tensor:
    """The MLP over ``x``'s tokens one shard at a time, written into one output tensor."""
    flat = x.reshape(-1, x.shape[-1])
    out = None
    for a, b in shard_bounds(flat.shape[0], shards):
        piece = mlp_forward(flat[a:b])
        if out is None:
            out = piece.new_empty((flat.shape[0], piece.shape[-1]))
        out[a:b] = piece
        del piece
    return out.view(*x.shape[:-1], out.shape[-1])


def _tiled_forward(self: torch.nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The forward :func:`tile_mlps` binds to an MLP (a bound method, so ``copy.deepcopy`` rebinds it)."""
    untiled = self.__dict__[_UNTILED]
    if args or kwargs or x.dim() < 2:
        return untiled(x, *args, **kwargs)
    tokens = x.numel() // max(1, x.shape[-1])
    shards = shard_count(tokens, self.__dict__.get(_SHARD_TOKENS) or x.shape[-1])
    if shards <= 1:
        return untiled(x)
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())):
        return _TiledMLP.apply(x, untiled, shards)
    return _sharded(x, untiled, shards)


@dataclass
class TilingReport:
    """What :func:`tile_mlps` did: MLPs tiled, and MLPs left untiled with the reason (class name or dropout)."""

    tiled: int = 0
    unknown: list[str] = field(default_factory=list)  # "Qwen3MoeSparseMoeBlock (not a gated MLP the tiler knows)"

    @property
    def complete(self) -> bool:
        return not self.unknown


def _decoder_mlps(model: torch.nn.Module):
    """``(name, module)`` of every module named ``mlp`` (a decoder layer's MLP)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "mlp":
            yield name, module


def _dropout_active(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules())


def tile_mlps(model: torch.nn.Module, shard_tokens: int | None = None) -> TilingReport:
    """Replace the forward of every decoder MLP the tiler knows (``KNOWN_MLP_CLASSES``) with the tiled one,
    in place (parameter names and the state dict do not change). ``shard_tokens``: tokens per shard, default
    the MLP input's width (``ceil(tokens / hidden)`` shards). Idempotent."""
    report = TilingReport()
    for name, mlp in _decoder_mlps(model):
        kind = type(mlp).__name__
        if kind not in KNOWN_MLP_CLASSES:
            if f"{kind} (" not in " ".join(report.unknown):
                report.unknown.append(f"{kind} (not a gated MLP the tiler knows: {', '.join(KNOWN_MLP_CLASSES)})")
            continue
        if _dropout_active(mlp):
            if not any("dropout" in u for u in report.unknown):
                report.unknown.append(f"{kind} with dropout (lora.dropout > 0: the recompute would draw other masks)")
            continue
        if _UNTILED not in mlp.__dict__:
            mlp.__dict__[_UNTILED] = mlp.forward  # the class's forward, bound
            mlp.__dict__["forward"] = types.MethodType(_tiled_forward, mlp)
        mlp.__dict__[_SHARD_TOKENS] = shard_tokens
        report.tiled += 1
    return report


def untile_mlps(model: torch.nn.Module) -> int:
    """Give every tiled MLP its original forward back; returns how many."""
    n = 0
    for _, mlp in _decoder_mlps(model):
        if _UNTILED in mlp.__dict__:
            for key in ("forward", _UNTILED, _SHARD_TOKENS):
                mlp.__dict__.pop(key, None)
            n += 1
    return n


def is_tiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` (an MLP) runs tiled."""
    return _UNTILED in module.__dict__
