"""Memory tricks and the budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class MemoryConfig:
    micro_batch_size: int | None = None
    """Completions per forward/backward pass; gradients accumulate over the step. None = all of a step."""
    micro_batch_tokens: int | None = None
    """Token budget per forward/backward pass: rows are sorted by length and packed while
    rows · longest row <= this (each micro-batch pads only to its own longest row; with
    ``micro_batch_size`` also set, at most that many rows). None = use ``micro_batch_size``."""
    gradient_checkpointing: bool = False
    """Recompute layer activations in backward instead of keeping them."""
    share_prompt_forward: bool = True
    """Run each group's prompt through the model once in the update instead of once per completion: either
    packed with the completions into one unpadded sequence under a block mask (where that is less work:
    completions of very different lengths, at most 4,096 real tokens per micro-batch) or with its KV fanned
    out to the group's completions (off automatically with gradient checkpointing and where the planner
    says it would keep more memory than the plain update). Same gradients."""
    offload_activations: bool = False
    """Keep checkpointed layer inputs in CPU memory (needs ``gradient_checkpointing``)."""
    tiled_mlp: bool | Literal["auto", "on", "off"] = "auto"
    """Run each decoder layer's MLP on shards of the micro-batch's tokens (ceil(tokens / hidden) of them),
    each recomputed in backward, so only one shard's MLP intermediates are alive at a time (one more MLP
    forward per layer). ``auto``: on where the plan says it pays, i.e. at least 65,536 tokens per update
    micro-batch and a lower planned peak; ``on`` / ``off`` (or true / false) as said. Llama, Mistral, Qwen2
    and Qwen3 MLPs; another MLP class runs untiled only if the plan without tiling fits ``budget``."""
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    """``adamw_8bit``: 8-bit AdamW, about 2 B of state per trained parameter instead of 2 moments: torchao's
    (``pip install 'slimgrpo[ao]'``) on CPU, under FSDP2 (its parameters are DTensors, which bitsandbytes'
    does not take) and for bfloat16 full fine-tuning (its stochastic rounding, ``bf16_update``);
    bitsandbytes' (``slimgrpo[gpu]``) on one GPU otherwise (LoRA, float32 weights). Not with FSDP2 and bfloat16
    full fine-tuning: no 8-bit AdamW steps bfloat16 DTensors there (refused; docs/benchmarks.md#bf16-full-fine-tuning)."""
    bf16_update: Literal["auto", "fp32_master", "stochastic_round", "plain"] = "auto"
    """How the optimizer moves weights trained in bfloat16 (full fine-tuning with ``model.dtype=bfloat16``,
    or ``auto`` on a GPU; LoRA adapters train in float32 and need nothing). A plain bfloat16 step rounds
    away: at learning rate 1e-6 about 98% of the elements of N(0, 0.02) weights do not move
    (docs/benchmarks.md#bf16-full-fine-tuning). ``fp32_master``: a float32 copy of each weight (beside it,
    sharded like it under FSDP2) and float32 AdamW moments take the step; the bfloat16 weight is the
    copy rounded (4 B per parameter more, and 4 B more of moments with ``adamw``). ``stochastic_round``:
    torchao's optimizer rounds the float32 result to bfloat16 up or down at random, in proportion, so
    updates survive on average at no memory cost (needs torchao). ``auto``: ``stochastic_round`` with
    ``optimizer=adamw_8bit``, ``fp32_master`` with ``adamw``. ``plain``: bfloat16 steps as they round
    (the update is lost; for comparisons)."""
    budget: str | None = None
    """Memory budget, e.g. ``16GiB``; ``auto`` = the device's free memory. The run is refused before
    loading the model when the plan does not fit."""
    host_budget: str | None = "auto"
    """Host RAM a CUDA run may hold off the GPU: offloaded checkpoints (``offload_activations``) and the
    full-fine-tuning reference copy, e.g. ``64GiB``. ``auto``: the machine's available memory
    (``MemAvailable``) when the run starts; null: not checked. A run whose plan needs more is refused before
    it starts, with both numbers; ``fit`` does not offload past it."""
    reference_placement: Literal["auto", "device", "stream", "host"] = "auto"
    """Where the full-fine-tuning reference policy (``loss.beta > 0`` without LoRA) lives on a CUDA run: ``device``: a
    frozen copy kept on the GPU (N·B bytes there); ``stream``: the copy in pinned host memory, run on the GPU with
    its decoder layers copied in one by one while the previous one computes (the embedding, final norm and head for
    the pass, two layers at most); ``host``: the copy in host memory, run on the CPU (slow: minutes a step from ~1B
    parameters). ``auto``: ``device`` when the plan with it there fits ``budget`` (or the GPU), else ``stream``. On a
    CPU device host memory is the device: every value runs there."""
    fit: bool | Literal["trace"] = False
    """When the plan exceeds ``budget``, apply the suggested changes instead of refusing. ``trace``: also
    check the settings by tracing one full-size step on fake tensors (``slimgrpo plan --trace``; seconds to
    minutes, no memory) and tighten them until the traced peak fits the budget too."""


BF16_RULES = ("fp32_master", "stochastic_round", "plain")


def bf16_update_rule(bf16_update: str, optimizer: str) -> str:
    """What ``memory.bf16_update`` means for bfloat16 trainable weights under ``memory.optimizer``: one of
    ``BF16_RULES``. One place, read by the optimizer (update/optim.py) and the run spec (spec/run.py, ``RunSpec.fp32_master``),
    so that the plan counts the bytes the run holds. ``auto`` depends on the config alone (not on what is
    installed), so a plan made on one machine holds on another."""
    if bf16_update != "auto":
        return bf16_update
    return "stochastic_round" if optimizer == "adamw_8bit" else "fp32_master"
