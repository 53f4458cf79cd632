"""The lean decode step for Llama-shaped decoders (Llama, Qwen2, Qwen3, Mistral without a sliding window).

``LlamaStepper`` runs the decoder layers itself: a preallocated KV buffer written in place, rotary tables
computed once, one additive padding mask sliced per step, and grouped-query attention folded into the
query axis (no K/V repetition). It calls the model's own submodules (norms, projections, MLP), so LoRA
adapters and other module wrappers apply as usual. It is only used where ``LlamaStepper.supports`` says so.

It is the base of the quantised-cache stepper (kv_quant.py) and of the static-cache / CUDA-graph stepper
(cuda_graph.py); ``decode.make_stepper`` chooses among them. Same interface as decode.py's ``HFStepper``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from slimgrpo.families import llama_like
from .model_parts import CausalLMParts, stacked_product


class LlamaStepper:
    """Lean decode step for Llama-shaped decoders (see the module docstring)."""

    @staticmethod
    def supports(parts: CausalLMParts, total_len: int) -> bool:
        """True when this stepper reproduces the model's own forward for sequences up to ``total_len``."""
        config = parts.config.get_text_config() if hasattr(parts.config, "get_text_config") else parts.config
        if not llama_like(getattr(config, "model_type", None)):
            return False
        layer_types = getattr(config, "layer_types", None) or []
        if any(kind != "full_attention" for kind in layer_types):
            return False
        window = getattr(config, "sliding_window", None)
        if layer_types == [] and window is not None and window < total_len:
            return False
        # Rotary tables are computed once for all positions: rope types whose frequencies depend on
        # the current length (dynamic NTK, longrope) or that rotate part of each head are left out.
        if _rope_types(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)) & {
            "dynamic", "longrope"
        } or getattr(config, "partial_rotary_factor", None) not in (None, 1, 1.0):
            return False
        decoder = parts.decoder
        if not all(hasattr(decoder, name) for name in ("layers", "norm", "rotary_emb")):
            return False
        # FSDP and similar wrappers gather parameters in hooks on the layer; calling its submodules
        # directly would skip them.
        return not any("FSDP" in type(m).__name__ or hasattr(m, "_fsdp_state") for m in decoder.modules())

    def _read_layers(self, parts: CausalLMParts, prompt_mask: torch.Tensor) -> None:
        """The decoder's layers and attention shape, and the prompt width (shared with the static-cache stepper)."""
        self.parts, self.layers = parts, list(parts.decoder.layers)
        self.P, self.t = prompt_mask.shape[1], 0
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = getattr(first, "scaling", self.head_dim**-0.5)
        self.has_qk_norm = hasattr(first, "q_norm") and hasattr(first, "k_norm")

    def __init__(self, parts: CausalLMParts, cache, prompt_mask: torch.Tensor, max_new: int) -> None:
        self._read_layers(parts, prompt_mask)
        n, P = prompt_mask.shape
        # The stacked packed weights of this generate call (CausalLMParts.fused), looked up once, not per step.
        self.qkv_stacked = [parts.fused.get((l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj))
                            for l in self.layers]
        self.gate_up_stacked = [parts.fused.get((getattr(l.mlp, "gate_proj", None), getattr(l.mlp, "up_proj", None)))
                                for l in self.layers]
        self.next_pos = prompt_mask.sum(-1)  # [b]
        self.native_gqa = parts.target.kind_of(prompt_mask) == "cpu"

        dtype = cache.layers[0].keys.dtype
        self._init_kv(cache, n, P, max_new)
        # Additive mask [b, 1, 1, P + max_new]: -inf on left padding, 0 elsewhere (generated tokens).
        self.mask = torch.zeros(n, 1, 1, P + max_new, dtype=dtype, device=prompt_mask.device)
        self.mask[:, 0, 0, :P].masked_fill_(~prompt_mask.bool(), float("-inf"))
        # Rotary tables for every position a row can reach; sin carries the sign of rotate_half.
        positions = torch.arange(P + max_new, device=prompt_mask.device)[None]  # [1, P + max_new]
        probe = torch.zeros(1, 1, 1, dtype=dtype, device=prompt_mask.device)
        cos, sin = parts.decoder.rotary_emb(probe, positions)  # [1, P + max_new, head_dim] each
        half = self.head_dim // 2
        self.cos = cos[0]
        self.sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of ``x`` [b, heads, head_dim]: x*cos + rotate_half(x)*sin."""
        return torch.addcmul(x * cos, x.roll(self.head_dim // 2, dims=-1), sin_signed)

    def step_rows(self, rows: int) -> int:
        """Rows one step computes for a batch of ``rows``: all of them (the CUDA-graph stepper pads)."""
        return rows

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        b, d, col = tokens.shape[0], self.head_dim, self.P + self.t
        end = col + 1
        cos = self.cos[self.next_pos][:, None]  # [b, 1, d]
        sin_signed = self.sin_signed[self.next_pos][:, None]  # [b, 1, d]
        x = self.parts.decoder.embed_tokens(tokens)  # [b, H]
        mask = self.mask[:, :, :, :end]  # [b, 1, 1, end]
        linear = self.parts.linear  # module(x), or its packed weight when one is held
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = self._products((attn.q_proj, attn.k_proj, attn.v_proj), self.qkv_stacked[i], h)
            q, k, v = q.view(b, -1, d), k.view(b, -1, d), v.view(b, -1, d)  # [b, heads or kv_heads, d]
            if self.has_qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self._rope(q, cos, sin_signed), self._rope(k, cos, sin_signed)
            keys, values = self._kv(i, col, k, v, end)  # [b, kv_heads, end, d] each
            out = self._attend(q, keys, values, mask)
            x = x + linear(attn.o_proj, out.reshape(b, -1))
            x = x + self._mlp(layer.mlp, layer.post_attention_layernorm(x), self.gate_up_stacked[i])
        self.next_pos = self.next_pos + 1
        self.t += 1
        return self.parts.decoder.norm(x)  # [b, H]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One query per row [b, heads, d] against ``keys``/``values`` [b, kv_heads, end, d], grouped-query
        attention without repeating K/V. On CPU sdpa's own GQA (each KV head read once for the heads sharing
        it: 320 against 520 us a layer at SmolLM2's 16 rows x 229 keys, folded); elsewhere the heads
        sharing a KV head become that head's query rows (the masked GPU kernels take no ``enable_gqa``)."""
        b, d = q.shape[0], q.shape[-1]
        if self.native_gqa:
            return F.scaled_dot_product_attention(
                q.unsqueeze(2), keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=True
            )  # [b, heads, 1, d]
        q = q.view(b, keys.shape[1], -1, d)  # [b, kv_heads, heads_per_kv, d]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)

    def _mlp(self, mlp, h: torch.Tensor, stacked=None) -> torch.Tensor:
        """Gated MLP ``down(act(gate(h)) * up(h))`` through ``parts`` (packed weights; gate/up one product
        where ``stacked``)."""
        if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return mlp(h)
        gate, up = self._products((mlp.gate_proj, mlp.up_proj), stacked, h)
        return self.parts.linear(mlp.down_proj, mlp.act_fn(gate) * up)

    def _products(self, modules: tuple, stacked, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``module(h)`` for each of ``modules`` (projections of one input): one product through their
        stacked packed weight where this generate call built one (``CausalLMParts.fused``), else one each."""
        if stacked is None:
            return tuple(self.parts.linear(m, h) for m in modules)
        return stacked_product(stacked, h)

    def _init_kv(self, cache, n: int, P: int, max_new: int) -> None:
        """KV buffers [b, kv_heads, P + max_new, head_dim], prompt part copied from the prefill cache
        (``kv_quant.QuantLlamaStepper`` stores them quantised instead). Each layer's prefill tensors are
        released from the cache once copied (``release_prefill_layer``): the prompt's keys and values are
        never held twice, only one layer's while it moves."""
        self.keys, self.values = [], []
        for i in range(len(self.layers)):
            k, v = cache.layers[i].keys, cache.layers[i].values  # [n, kv_heads, P, head_dim]
            kb = k.new_empty(n, k.shape[1], P + max_new, k.shape[3])
            vb = v.new_empty(n, v.shape[1], P + max_new, v.shape[3])
            kb[:, :, :P], vb[:, :, :P] = k, v
            del k, v
            release_prefill_layer(cache, i)
            self.keys.append(kb)
            self.values.append(vb)

    def _kv(self, i: int, col: int, k: torch.Tensor, v: torch.Tensor, end: int):
        """Write this step's k, v [b, kv_heads, d] of layer ``i`` at ``col``; the keys and values to attend to."""
        self.keys[i][:, :, col] = k
        self.values[i][:, :, col] = v
        return self.keys[i][:, :, :end], self.values[i][:, :, :end]

    def select(self, keep: torch.Tensor) -> None:
        self.keys = [k[keep] for k in self.keys]
        self.values = [v[keep] for v in self.values]
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]


def release_prefill_layer(cache, i: int) -> None:
    """Drop layer ``i``'s keys and values from a prefill cache the stepper has copied (the cache is not used
    again: the stepper holds the prompt from here on)."""
    layer = cache.layers[i]
    layer.keys = layer.keys.new_empty(0)
    layer.values = layer.values.new_empty(0)


def _rope_types(rope: object) -> set[str]:
    """Every ``rope_type`` named in a (possibly per-layer-type, nested) rope config dict."""
    if not isinstance(rope, dict):
        return set()
    found = {str(rope[key]) for key in ("rope_type", "type") if key in rope}
    for value in rope.values():
        found |= _rope_types(value)
    return found


__all__ = ["LlamaStepper"]
