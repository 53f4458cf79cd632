"""Weight precision and the optimizer: the combinations that cannot train, refused before weights load.

- float16 full fine-tuning: slimgrpo steps the weights it trains in their own dtype (no float32 master copy of
  float16 weights), so AdamW would run on float16 weights (small updates round away, large values overflow).
  LoRA on a float16 base trains float32 adapters, with the loss scaled dynamically (update/loss_scale.py).
- ``memory.bf16_update=fp32_master`` with 8-bit AdamW: the master copy is for ``adamw``; 8-bit AdamW keeps
  bfloat16 updates by stochastic rounding.
- 8-bit AdamW under FSDP2 for bfloat16 full fine-tuning: bitsandbytes' takes no DTensors and torchao's
  fails on bfloat16 DTensors (``FSDP_BF16_8BIT``).
- A setting that needs torchao where it is not installed: 8-bit AdamW under FSDP2 (its DTensor parameters
  are not taken by bitsandbytes) and stochastic rounding of bfloat16 weights.
- A setting that needs bitsandbytes where it is not installed (``bitsandbytes_problem``): a 4-bit base (QLoRA)
  and 8-bit AdamW on a GPU without FSDP2 or stochastic rounding. Said before the plan and the weights, with the
  install line, rather than as transformers' ImportError after the model starts loading.
"""

from __future__ import annotations

import importlib.util

from slimgrpo.config.sections.memory import bf16_update_rule
from slimgrpo.config.tree import Config


# Seen with torch 2.13 and torchao 0.18 (gloo, CPU): torch.compile of torchao's Adam step converts the
# DTensor around an 8-bit state of a bfloat16 parameter to a fake tensor through aten.view.dtype, which
# OptimState8bit does not implement; float32 DTensors (LoRA adapters) and plain bfloat16 tensors step fine.
FSDP_BF16_8BIT = "torch 2.13, torchao 0.18: OptimState8bit has no aten.view.dtype"


def trains_bf16(cfg: Config, on_cpu: bool) -> bool:
    """Whether the weights the optimizer steps are bfloat16: full fine-tuning (LoRA adapters are float32)
    with ``model.dtype=bfloat16``, or ``auto`` on a GPU (modeling.resolve_dtype)."""
    return not cfg.lora.enabled and (cfg.model.dtype == "bfloat16" or (cfg.model.dtype == "auto" and not on_cpu))


def precision_problem(cfg: Config, on_cpu: bool) -> str | None:
    """Why this config's weights cannot be trained as set (with the keys to change), or None."""
    mem = cfg.memory
    if cfg.model.dtype == "float16" and not cfg.lora.enabled:
        return ("model.dtype=float16 with full fine-tuning (lora.enabled=false): slimgrpo keeps no float32 master "
                "copy of float16 weights, so AdamW would step float16 weights directly (updates below their "
                "precision are lost, large values overflow). Use model.dtype=bfloat16 (float32 master weights or "
                "stochastic rounding: memory.bf16_update) or model.dtype=float32; float16 suits LoRA, whose "
                "adapters train in float32 with the loss scaled dynamically")
    if mem.bf16_update == "fp32_master" and mem.optimizer == "adamw_8bit":
        return ("memory.bf16_update=fp32_master with memory.optimizer=adamw_8bit: the float32 master copy is for "
                "memory.optimizer=adamw; 8-bit AdamW keeps bfloat16 updates by memory.bf16_update="
                "stochastic_round (the default, auto, chooses it)")
    if mem.optimizer == "adamw_8bit" and cfg.distributed.strategy == "fsdp" and trains_bf16(cfg, on_cpu):
        return ("distributed.strategy=fsdp with memory.optimizer=adamw_8bit and bfloat16 full fine-tuning: "
                "bitsandbytes' 8-bit AdamW takes no DTensor parameters (illegal memory access), and torchao's "
                f"fails to compile its step on bfloat16 DTensors ({FSDP_BF16_8BIT}). Use memory.optimizer=adamw "
                "(float32 master weights, sharded over the ranks like the weights), LoRA (lora.enabled=true: "
                "float32 adapters, which torchao's 8-bit AdamW steps under FSDP2), or distributed.strategy=ddp")
    if importlib.util.find_spec("torchao") is not None:
        return None
    if mem.optimizer == "adamw_8bit" and cfg.distributed.strategy == "fsdp":
        return ("distributed.strategy=fsdp with memory.optimizer=adamw_8bit needs torchao's 8-bit AdamW, which "
                "takes FSDP2's sharded (DTensor) parameters; bitsandbytes' does not (illegal memory access). "
                "pip install 'slimgrpo[ao]', or use memory.optimizer=adamw")
    if trains_bf16(cfg, on_cpu) and bf16_update_rule(mem.bf16_update, mem.optimizer) == "stochastic_round":
        return (f"memory.bf16_update={mem.bf16_update} with memory.optimizer={mem.optimizer} rounds bfloat16 "
                "weights stochastically in torchao's optimizer, and torchao is not installed: pip install "
                "'slimgrpo[ao]', or use memory.optimizer=adamw (float32 master weights and moments: 12 B of optimizer state per parameter)")
    return None


BITSANDBYTES = "pip install 'slimgrpo[gpu]' (bitsandbytes >= 0.45, CUDA builds only)"


def bitsandbytes_problem(cfg: Config, on_cpu: bool) -> str | None:
    """What this config asks of bitsandbytes where it is not installed, with the install line, or None."""
    if importlib.util.find_spec("bitsandbytes") is not None:
        return None
    mem = cfg.memory
    if cfg.model.load_in_4bit and not on_cpu:  # (on a CPU the loader says it needs CUDA)
        return (f"model.load_in_4bit=true (QLoRA) stores the base in bitsandbytes' 4-bit NF4, and bitsandbytes is "
                f"not installed: {BITSANDBYTES}; or drop model.load_in_4bit (LoRA on a bfloat16 base)")
    plain = not trains_bf16(cfg, on_cpu) or bf16_update_rule(mem.bf16_update, mem.optimizer) == "plain"
    if mem.optimizer == "adamw_8bit" and not on_cpu and cfg.distributed.strategy != "fsdp" and plain:
        return (f"memory.optimizer=adamw_8bit on a GPU is bitsandbytes' AdamW8bit, and bitsandbytes is not "
                f"installed: {BITSANDBYTES}; or memory.optimizer=adamw")
    return None
