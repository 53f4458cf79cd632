"""Model and LoRA sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class ModelConfig:
    path: str = ""
    """Hugging Face causal LM: a local folder (config.json + safetensors), or a hub name when online."""
    tokenizer_path: str | None = None
    """Tokenizer folder when it differs from ``model.path``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weight dtype. ``auto``: bfloat16 on a GPU that supports it, float32 on CPU."""
    trust_remote_code: bool = False
    """Run Python code shipped inside the model folder. Off unless you trust the folder's author."""
    attn_implementation: str | None = "sdpa"
    """Attention kernel passed to transformers (``sdpa``, ``eager``, ``flash_attention_2``)."""
    load_in_4bit: bool = False
    """QLoRA: load the frozen base in 4-bit NF4 through bitsandbytes (CUDA only; needs ``lora.enabled``)."""
    disable_dropout: bool = False
    """Set every dropout layer's p to 0 (TRL's ``disable_dropout``, default False there too): log-probs of the
    update then match those of sampling and of the reference. Includes LoRA dropout."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train LoRA adapters through peft instead of all weights. The reference policy is then the base
    model with adapters disabled: no second copy of the weights."""
    r: int = 16
    """LoRA rank."""
    alpha: float = 32.0
    """LoRA scaling numerator (``lora_alpha``); the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. ``[q_proj, v_proj]``) or ``all-linear``."""
