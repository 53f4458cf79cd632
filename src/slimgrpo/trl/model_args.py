"""TRL's helpers over ``ModelConfig`` that its example scripts call, written for slimgrpo.trl:

    from slimgrpo.trl import ModelConfig, get_peft_config, get_quantization_config, get_kbit_device_map

- ``get_peft_config(model_args)``: a peft ``LoraConfig`` from the ``lora_*`` fields when ``use_peft`` is set,
  else None;
- ``get_quantization_config(model_args)``: a transformers ``BitsAndBytesConfig`` for ``load_in_4bit`` (NF4
  settings from the ``bnb_4bit_*`` fields, computing in ``dtype``) or ``load_in_8bit``, else None;
- ``get_kbit_device_map()``: ``{"": this process's GPU}`` where there is a GPU (a quantized model is placed
  whole on it), else None.

They build what TRL's build, so a script's objects are the same; what slimgrpo then trains from them is the
trainer's business (``GRPOTrainer`` / ``PPOTrainer`` refuse what they cannot honour, e.g. DoRA or 8-bit).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["get_kbit_device_map", "get_peft_config", "get_quantization_config"]


def get_peft_config(model_args: Any):
    """The ``LoraConfig`` of ``model_args`` (TRL's ``ModelConfig``), or None when ``use_peft`` is off."""
    if not model_args.use_peft:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ValueError("use_peft needs the peft package: pip install peft") from None
    extra = {}
    if model_args.lora_target_parameters is not None:  # named only when given, as TRL does
        extra["target_parameters"] = model_args.lora_target_parameters
    return LoraConfig(task_type=model_args.lora_task_type, r=model_args.lora_r,
                      target_modules=model_args.lora_target_modules, lora_alpha=model_args.lora_alpha,
                      lora_dropout=model_args.lora_dropout, bias="none", use_rslora=model_args.use_rslora,
                      use_dora=model_args.use_dora, modules_to_save=model_args.lora_modules_to_save, **extra)


def get_quantization_config(model_args: Any):
    """A ``BitsAndBytesConfig`` for ``load_in_4bit`` or ``load_in_8bit``, or None when neither is set."""
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if model_args.load_in_4bit:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=model_args.dtype,
                                  bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
                                  bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
                                  bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage)
    return BitsAndBytesConfig(load_in_8bit=True)


def get_kbit_device_map() -> dict[str, int] | None:
    """``{"": LOCAL_RANK}`` when CUDA (or an Intel XPU) is there, else None: where a quantized model loads."""
    import torch

    if torch.cuda.is_available() or torch.xpu.is_available():  # torch >= 2.4 has torch.xpu
        return {"": int(os.environ.get("LOCAL_RANK", "0") or 0)}
    return None
