"""A model's position limit from its ``config.json``, after rope scaling (pure: a dict in, a number out).

``max_position_embeddings`` is the window the model was trained at. A rope scaling entry can stretch it:
Qwen3-8B ships 40,960 positions and its model card enables YaRN with ``factor`` 4 over
``original_max_position_embeddings`` 32,768, i.e. 131,072 positions. Llama-3.1's ``llama3`` scaling is
already counted in its ``max_position_embeddings`` (131,072 = more than 8 x 8,192 would say), so the limit
is the larger of the two::

    limit = max(max_position_embeddings, original_max_position_embeddings · factor)

read from ``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5, possibly one entry per
layer type), ``original_max_position_embeddings`` defaulting to ``max_position_embeddings``. A rope type
without a factor (``default``, ``longrope``'s per-dimension factors) leaves ``max_position_embeddings``.
"""

from __future__ import annotations

from typing import Any

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _rope_entries(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rope dict of the config: ``rope_scaling`` / ``rope_parameters``, or their per-layer-type values."""
    found = []
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if not isinstance(value, dict):
            continue
        nested = [v for v in value.values() if isinstance(v, dict)]
        found.extend(nested if nested else [value])
    return found


def position_limit(model_config: dict[str, Any]) -> tuple[int | None, str]:
    """``(limit, how)``: the most positions a sequence may span, and how it was read (for messages); ``(None,
    "")`` when the config names no limit. A multimodal config is read from its ``text_config``."""
    config = model_config.get("text_config") if isinstance(model_config.get("text_config"), dict) else model_config
    base = next((config[k] for k in POSITION_KEYS if isinstance(config.get(k), int) and config[k] > 0), None)
    if base is None:
        return None, ""
    best, how = base, f"max_position_embeddings {base:,}"
    for rope in _rope_entries(config):
        factor = rope.get("factor")
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1 or kind == "default":
            continue
        original = rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        original = original if isinstance(original, int) and original > 0 else base
        scaled = int(original * factor)
        if scaled > best:
            best, how = scaled, f"{kind} rope scaling x{factor:g} over {original:,} positions"
    return best, how
