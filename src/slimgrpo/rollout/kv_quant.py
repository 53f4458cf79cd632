"""Quantised KV cache for rollouts (``rollout.kv_cache_dtype``): ``fp8_e4m3`` or ``int8``.

Keys and values are stored in one byte per value with one fp32 scale per (row, kv head, position):
the scale is ``amax(|x|) / QMAX`` over the head dimension of that token's head, so every head of every
token uses the whole code range (int8: round to nearest, QMAX 127; fp8 e4m3: QMAX 448, the largest
finite e4m3 value). Memory per cached value: ``1 + 4 / head_dim`` bytes instead of 2 (bf16) or 4 (fp32).

Each decode step writes the new token's keys/values quantised and attends to the dequantised prefix
(one layer at a time, a transient ``[b, kv_heads, end, head_dim]`` pair in the compute dtype). The
prompt prefill runs at full precision; its cache is quantised once when decoding starts. Only the
lean Llama-family stepper (``llama_stepper.LlamaStepper``) supports it.
"""

from __future__ import annotations

import torch

from .llama_stepper import LlamaStepper, release_prefill_layer

KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "int8")
QMAX = {"int8": 127.0, "fp8_e4m3": 448.0}
STORAGE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


def bytes_per_value(kind: str, head_dim: int, compute_bytes: int) -> float:
    """Cache bytes per key/value element: the compute dtype for ``auto``, else 1 + a 4-byte scale per head."""
    return compute_bytes if kind in (None, "auto") else 1 + 4 / head_dim


def quantize(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., d] -> (codes [..., d] int8 / float8_e4m3fn, scale [..., 1] fp32)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / QMAX[kind]
    y = xf / scale
    if kind == "int8":
        return y.round().clamp(-127, 127).to(torch.int8), scale
    return y.clamp(-QMAX[kind], QMAX[kind]).to(torch.float8_e4m3fn), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (codes.float() * scale).to(dtype)


class QuantBuffer:
    """One layer's keys (or values): codes [n, kv_heads, L, d] and scales [n, kv_heads, L, 1]."""

    def __init__(self, prefix: torch.Tensor, total: int, kind: str) -> None:
        n, h, P, d = prefix.shape
        self.kind = kind
        self.codes = torch.empty(n, h, total, d, dtype=STORAGE[kind], device=prefix.device)
        self.scale = torch.empty(n, h, total, 1, dtype=torch.float32, device=prefix.device)
        self.codes[:, :, :P], self.scale[:, :, :P] = quantize(prefix, kind)

    def write(self, col: int, x: torch.Tensor) -> None:
        """``x`` [b, kv_heads, d] at position ``col``."""
        codes, scale = quantize(x, self.kind)
        self.codes[:, :, col], self.scale[:, :, col] = codes, scale

    def read(self, end: int, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.codes[:, :, :end], self.scale[:, :, :end], dtype)

    def select(self, keep: torch.Tensor) -> None:
        self.codes, self.scale = self.codes[keep], self.scale[keep]


class QuantLlamaStepper(LlamaStepper):
    """``LlamaStepper`` whose KV buffers are stored quantised (see the module docstring)."""

    def __init__(self, parts, cache, prompt_mask: torch.Tensor, max_new: int, kind: str) -> None:
        if kind not in QMAX:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kind!r}")
        self.kind = kind
        super().__init__(parts, cache, prompt_mask, max_new)

    def _init_kv(self, cache, n: int, P: int, max_new: int) -> None:
        self.compute_dtype = cache.layers[0].keys.dtype
        self.keys, self.values = [], []
        for i in range(len(self.layers)):
            self.keys.append(QuantBuffer(cache.layers[i].keys, P + max_new, self.kind))
            self.values.append(QuantBuffer(cache.layers[i].values, P + max_new, self.kind))
            release_prefill_layer(cache, i)  # quantised copies made: the prompt's KV is not held twice

    def _kv(self, i: int, col: int, k: torch.Tensor, v: torch.Tensor, end: int):
        self.keys[i].write(col, k)
        self.values[i].write(col, v)
        return self.keys[i].read(end, self.compute_dtype), self.values[i].read(end, self.compute_dtype)

    def select(self, keep: torch.Tensor) -> None:
        for buf in self.keys + self.values:
            buf.select(keep)
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]


def make_quant_stepper(parts, cache, prompt_mask: torch.Tensor, max_new: int, lean: bool | None, kind: str):
    if kind not in QMAX:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kind!r}")
    if lean is False or not LlamaStepper.supports(parts, prompt_mask.shape[1] + max_new):
        raise ValueError(f"kv_cache_dtype={kind!r} needs the lean decode path (Llama / Qwen2 / Qwen3 / Mistral "
                         f"without sliding windows); use rollout.kv_cache_dtype=auto for this model")
    return QuantLlamaStepper(parts, cache, prompt_mask, max_new, kind)
