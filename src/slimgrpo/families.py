"""The decoder families slimgrpo models closely: Llama, Mistral, Qwen2 and Qwen3 (one table, read by the planner's
shapes, the lean decode stepper and the packed update layout).

    qkv_bias   q_proj / k_proj / v_proj carry a bias vector (Qwen2)
    qk_norm    an RMSNorm of size head_dim on queries and on keys in every layer (Qwen3)

Other architectures still train (through the model's own forward); these four are the ones whose layer the lean
stepper reproduces, whose decoder takes a prepared 4-D block mask as it is, and whose parameter count and
activations the planner writes out.
"""

from __future__ import annotations

FAMILIES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}
LLAMA_LIKE: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral")


def llama_like(model_type: str | None) -> bool:
    """Whether a Hugging Face ``config.model_type`` is one of the families above."""
    return model_type in LLAMA_LIKE


__all__ = ["FAMILIES", "LLAMA_LIKE", "llama_like"]
