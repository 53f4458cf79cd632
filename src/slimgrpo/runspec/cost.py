"""The language the planner and the stages share to say what a step costs: a ``Component`` line (name, bytes,
phase, formula), the phases, and the closed-form facts that are no single stage's (bytes of materialised logits
and of a KV cache, how weights and LoRA adapters are stored, how many parameters LoRA adds).

Each stage writes its own lines in its ``costs.py`` (``forward/costs.py``: what a decoder layer keeps;
``loss/costs.py``: the chunked head's working set; ``update/costs.py``: gradients, optimizer state and
backward's moments; ``rollout/costs.py``: the generation phase and vLLM); ``plan/model.py`` adds them up.

Symbols in the formulas (and in each line's ``formula`` string): N params, L layers, H hidden, I intermediate,
V vocab, q = heads·head_dim, kv = kv_heads·head_dim, B activation/compute bytes (2 for bf16/fp16, 4 for fp32),
G num_generations, rows = prompts_per_step·G, m = micro-batch rows, P/T prompt/completion length, S = P + T.
The derivations are in docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimgrpo.runspec.shape import ModelShape

KiB, MiB, GiB = 1024, 1024**2, 1024**3
PHASES = ("always", "generation", "update")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def num(x: float) -> str:
    """An integer with thousands separators, for formula strings."""
    return f"{int(x):,}"


@dataclass(frozen=True)
class Component:
    """One line of the plan."""

    name: str
    bytes: int
    phase: str  # "always" | "generation" | "update"
    formula: str  # how `bytes` was computed, with the numbers filled in
    location: str = "device"  # "device", or "host" for bytes parked in CPU RAM during a CUDA run


# LoRA adapters are kept in fp32 (peft's get_peft_model(autocast_adapter_dtype=True) default).
LORA_ADAPTER_BYTES = 4
# bitsandbytes NF4 with double quantisation (the QLoRA recipe): 4 bits per weight, one 8-bit
# absmax per block of 64 weights, one fp32 constant per 256 blocks -> 4.127 bits per weight.
NF4_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
# Compute dtype of a 4-bit base; embeddings, norms, biases and the LM head stay in it.
QLORA_COMPUTE_BYTES = 2


def logits_bytes(rows: int, tokens: int, vocab: int, dtype_bytes: int = 4, copies: int = 1) -> int:
    """Materialised logits: rows · tokens · vocab · dtype_bytes · copies.

    Llama-3.1-8B, 8 rows of 20,480 tokens, bf16, logits + gradient:
    2 · 2 · 8 · 20,480 · 128,256 = 84,053,852,160 B = 78.3 GiB.
    """
    return rows * tokens * vocab * dtype_bytes * copies


def kv_cache_bytes(layers: int, tokens: int, kv_heads: int, head_dim: int, rows: int = 1, dtype_bytes: int = 2) -> int:
    """KV cache: 2 (keys and values) · dtype_bytes · layers · tokens · kv_heads · head_dim · rows.

    Llama-3.1-8B (32 layers, 8 kv heads of 128), one 20,480-token sequence in bf16:
    2 · 2 · 32 · 20,480 · 1,024 = 2.5 GiB.
    """
    return 2 * dtype_bytes * layers * tokens * kv_heads * head_dim * rows


def lora_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """Expand "all-linear" and drop duplicates, in layer order."""
    wanted = set(LORA_MODULES) if "all-linear" in targets else set(targets)
    return tuple(m for m in LORA_MODULES if m in wanted)


def lora_num_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable LoRA parameters: L · Σ_targets r · (in + out)."""
    dims = shape.linear_dims()
    return shape.layers * sum(rank * sum(dims[m]) for m in lora_targets(targets))


def after_freed(components: list[Component], name: str, freed: int, what: str) -> list[Component]:
    """The line ``name`` is only alive after ``freed`` bytes (``what``) were released, so it holds only
    what exceeds them: max(0, its bytes - freed). The other lines are returned unchanged."""
    out = []
    for c in components:
        if c.name == name and c.bytes:
            c = Component(c.name, max(0, c.bytes - freed), c.phase,
                          f"{c.formula} = {num(c.bytes)}, after {what} ({num(freed)}) is freed: max(0, difference)")
        out.append(c)
    return out
