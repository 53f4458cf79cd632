"""Rollouts on vLLM, colocated in the training process (``rollout.engine=vllm``; TRL's ``vllm_mode=colocate``).

One ``vllm.LLM`` is built once, from the model folder, in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
no engine process, so the live tensors reach it without serialisation). Before a rollout the engine gets the
policy's current weights when they changed since the last one (an optimizer step was taken, or a trainable
parameter's in-place version counter moved): every weight, LoRA's adapted layers merged (``W + B A s``; vLLM's
own LoRA path decodes at 0.37x the base speed on CPU, docs/rollout.md#which-engine), through the worker's
``reload_weights(weights_iterator=...)``; then the prefix cache is dropped (it holds keys of the old weights).

``vllm`` is imported only here, lazily: the package works without it, and ``rollout.engine=vllm`` without it
is refused at validation (``vllm_problem``) with the install command, before any weights load.

What vLLM returns becomes a ``Rollout`` exactly like ``TorchRolloutEngine``'s: completions right-padded, the
EOS kept as the last token, ``is_truncated`` where the length limit cut the row, and the sampled tokens'
log-probs under the processed (tempered, filtered) distribution (``logprobs_mode="processed_logprobs"``), the
quantity ``update/sampler_correction.py`` compares with the training forward.

Determinism: each call draws one seed from the trainer's generator and passes it to vLLM per request, so the
same seed and weights give the same samples on one machine and vLLM version; vLLM documents no bit-exactness
across batch compositions or versions (its kernels batch rows differently), unlike the built-in engine.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.config.sections.rollout import device_kind
from slimgrpo.containers import Rollout
from slimgrpo.rollout.costs import vllm_kv_pool_bytes
from .sampling import SamplingParams

CRITIC_ADAPTER = "critic"  # modeling.CRITIC_ADAPTER, PPO's value adapter (rollout/ may not import modeling)


class VllmEngineError(RuntimeError):
    """vLLM failed while syncing or sampling: the run stops (no retry on a half-updated engine)."""


# ---------------------------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class VllmSettings:
    """What the colocated ``vllm.LLM`` is built with (``from_config`` derives it from the run's config)."""

    model_path: str
    dtype: str  # "float32" | "bfloat16" | "float16"
    device: str  # "cpu" | "cuda"
    max_model_len: int
    max_num_seqs: int
    kv_cache_bytes: int
    gpu_memory_utilization: float = 0.3
    sleep_mode: bool = False  # CUDA only
    seed: int = 0

    @classmethod
    def from_config(cls, cfg, model_path: str, model: nn.Module) -> "VllmSettings":
        r = cfg.rollout
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if r.vllm_dtype == "auto" else r.vllm_dtype
        device = device_kind(cfg.run.device)
        rows = r.max_batch_rows or cfg.run.batch_size
        max_len = cfg.data.max_prompt_length + r.max_completion_length
        mconf = unwrap_causal_lm(model).config
        if r.vllm_kv_cache_gb is not None:
            kv = int(r.vllm_kv_cache_gb * 2**30)
        else:
            kv = kv_cache_bytes(mconf, rows * max_len, torch.empty(0, dtype=getattr(torch, dtype)).element_size())
        return cls(model_path=model_path, dtype=dtype, device=device, max_model_len=max_len,
                   max_num_seqs=max(1, min(rows, 256)), kv_cache_bytes=kv,
                   gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                   sleep_mode=r.vllm_sleep_mode and device == "cuda", seed=cfg.run.seed)


def kv_cache_bytes(model_config, tokens: int, dtype_bytes: int) -> int:
    """Bytes of a KV pool holding ``tokens`` positions (``costs.vllm_kv_pool_bytes``, the plan's line) on this model."""
    layers = model_config.num_hidden_layers
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return vllm_kv_pool_bytes(layers, heads, head_dim, tokens, dtype_bytes)


def llm_kwargs(s: VllmSettings) -> dict[str, Any]:
    """``vllm.LLM`` arguments for ``s``: eager on CPU (compiling took 88-156 s and its cache was never reused,
    docs/rollout.md), the KV pool by size rather than vLLM's default share of the machine, processed log-probs."""
    kw: dict[str, Any] = dict(
        model=s.model_path, tokenizer=s.model_path, dtype=s.dtype, max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs, seed=s.seed, enable_prefix_caching=True,
        logprobs_mode="processed_logprobs", kv_cache_memory_bytes=s.kv_cache_bytes,
    )
    if s.device == "cpu":
        kw["enforce_eager"] = True
    else:
        kw["gpu_memory_utilization"] = s.gpu_memory_utilization
        kw["enable_sleep_mode"] = s.sleep_mode
    return kw


def prepare_environment(device: str) -> None:
    """Environment vLLM reads when it starts: one process (the live tensors are handed over in memory), and on
    CPU no thread binding (vLLM would pin *this* process, the trainer's threads with it, to its cores).
    Variables the user set win."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


# ---------------------------------------------------------------------------------------------- sampling

def sampling_kwargs(params: SamplingParams, n: int, seed: int | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` arguments with the meaning of ``params`` (TRL / Hugging Face names): the EOS
    ids stop a row and stay in it, ``min_new_tokens`` holds them back, the log-prob of each sampled token."""
    return dict(
        n=n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0, min_p=params.min_p,
        repetition_penalty=params.repetition_penalty, max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens, stop_token_ids=list(params.eos_token_ids), ignore_eos=False,
        logprobs=0, seed=seed, detokenize=False, skip_special_tokens=False,
    )


def rollout_from_outputs(outputs: list[Any], prompt_ids: list[list[int]], n: int, params: SamplingParams,
                         device: torch.device) -> Rollout:
    """vLLM's ``RequestOutput`` list, in prompt order, as a ``Rollout`` of ``n`` completions per prompt: row
    ``r`` belongs to prompt ``r // n``."""
    from .engine import left_pad

    rows = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]  # one request per prompt
    # (n completions each), or, greedy, n requests per prompt of one completion each
    assert len(rows) == len(prompt_ids) * n, (len(rows), len(prompt_ids), n)
    T = max(1, max(len(c.token_ids) for c in rows))
    ids = torch.full((len(rows), T), params.pad_token_id, dtype=torch.long)
    logp = torch.zeros(len(rows), T, dtype=torch.float32)
    lengths = torch.zeros(len(rows), dtype=torch.long)
    truncated = torch.zeros(len(rows), dtype=torch.bool)
    eos = set(params.eos_token_ids)
    for i, c in enumerate(rows):
        toks = list(c.token_ids)
        ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
        lengths[i] = len(toks)
        truncated[i] = not (toks and toks[-1] in eos)
        if not params.greedy and c.logprobs is not None:  # greedy: a point mass, log-prob 0 (as sampling.py)
            logp[i, :len(toks)] = torch.tensor([float(step[tok].logprob) for tok, step in zip(toks, c.logprobs)])
    prompt, prompt_mask = left_pad(prompt_ids, params.pad_token_id, device)
    return Rollout(prompt_ids=prompt, prompt_mask=prompt_mask, completion_ids=ids.to(device),
                   completion_mask=(torch.arange(T)[None, :] < lengths[:, None]).to(device),
                   is_truncated=truncated.to(device), sampler_logprobs=logp.to(device), num_generations=n)


# ---------------------------------------------------------------------------------------------- weights

def _is_lora_layer(m: nn.Module) -> bool:
    return hasattr(m, "base_layer") and hasattr(m, "lora_A") and hasattr(m, "get_delta_weight")


def live_weights(model: nn.Module, changed_only: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor)`` of the policy as vLLM loads it. LoRA (peft): every adapted layer's merged
    weight ``W + delta`` under the base layer's name (the critic adapter of PPO left out), plus, unless
    ``changed_only``, the other weights. Full fine-tuning: the trainable parameters (all of them unless
    ``changed_only``). Tensors are detached views or fresh merges; nothing in the model is changed."""
    base = unwrap_causal_lm(model)
    lora_layers = {name: m for name, m in base.named_modules() if _is_lora_layer(m)}
    with torch.no_grad():
        for name, m in lora_layers.items():
            weight = m.base_layer.weight.detach()
            for adapter in getattr(m, "active_adapters", []):
                if adapter in m.lora_A and adapter != CRITIC_ADAPTER and not getattr(m, "disable_adapters", False):
                    weight = weight + m.get_delta_weight(adapter).to(weight.dtype)
            yield f"{name}.weight", weight
            if getattr(m.base_layer, "bias", None) is not None and not changed_only:  # LoRA leaves biases as they are
                yield f"{name}.bias", m.base_layer.bias.detach()
        if lora_layers and changed_only:
            return
        for name, p in base.named_parameters():
            if ".lora_" in name or f".{CRITIC_ADAPTER}." in name or any(name.startswith(k + ".") for k in lora_layers):
                continue
            if changed_only and not p.requires_grad:
                continue
            yield name, p.detach()


_OPTIMIZER_STEPS = [0]  # optimizer steps taken in this process (any torch optimizer), counted by a global hook
_HOOKED: list[Any] = []


def _count_optimizer_steps() -> None:
    """Count every ``torch.optim.Optimizer.step`` of the process from now on (once per process): fused
    kernels (torch's fused AdamW) change parameters without bumping their version counters."""
    if not _HOOKED:
        def counted(optimizer, args, kwargs):
            _OPTIMIZER_STEPS[0] += 1

        from torch.optim.optimizer import register_optimizer_step_post_hook

        _HOOKED.append(register_optimizer_step_post_hook(counted))


def weights_version(model: nn.Module) -> tuple[int, ...]:
    """When this changes, the engine's copy is stale: optimizer steps taken, plus the in-place version
    counters of the trainable parameters (edits outside an optimizer: a checkpoint loaded, a test's
    perturbation). A rollout for evaluation between two steps costs no sync."""
    return (_OPTIMIZER_STEPS[0], *(p._version for p in model.parameters() if p.requires_grad))


def refresh_tied_head(worker) -> bool:
    """Run on vLLM's worker after a reload: a tied LM head shares the embedding's weight, so the reload never
    loads it by name and skips its processing, and on CPU the head keeps the packed GEMM copy made at start-up
    (measured: a changed embedding then sampled from the old head, log-probs off by up to 126 nats). Re-running
    the head's processing repacks it from the (new) shared weight. True when there was a tied head to refresh."""
    model = worker.model_runner.model
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight:
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


# vLLM 0.32's layer-wise reload logs "<layer class>: Failed to load weights" for each layer the weights given did not
# name. Two of those are expected on every sync: rotary embeddings (no weights, a computed cos/sin cache) and a tied
# LM head (it is the embedding's weight; refresh_tied_head repacks it). Any other layer's warning is real.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's reload warnings for the rotary embedding and, when the policy ties it, the LM head."""

    def __init__(self, tied_head: bool):
        super().__init__()
        self.tied_head = tied_head

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.endswith(": Failed to load weights"):
            return True
        layer = text.split(":", 1)[0]
        return not (layer.endswith("RotaryEmbedding") or (self.tied_head and layer == "ParallelLMHead"))


def ties_head(model: nn.Module) -> bool:
    """True when the policy's output layer is its input embedding (tied weights)."""
    model = unwrap_causal_lm(model)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embed is not None and head.weight is embed.weight


# ---------------------------------------------------------------------------------------------- the engine

class VllmRolloutEngine:
    """``RolloutEngine`` on a colocated ``vllm.LLM`` (module docstring).

    Args:
        model: the trainer's live policy (a transformers causal LM or a peft model); read, never changed.
        settings: how the LLM is built (``VllmSettings.from_config``).
        llm_factory: builds the LLM from ``llm_kwargs(settings)`` (tests pass a fake); default ``vllm.LLM``.
    """

    off_policy = True  # its samples come from another copy of the weights: the trainer corrects for them

    def __init__(self, model: nn.Module, settings: VllmSettings, llm_factory: Callable[..., Any] | None = None):
        self.model, self.settings = model, settings
        self._factory = llm_factory
        self._llm = None
        self._version: tuple[int, ...] | None = None  # weights the engine holds (None: not synced yet)
        self._asleep = False
        self._weights_dropped = False  # sleep level 2 discarded them: sync even if the policy did not move
        self._dead: str | None = None
        self.metrics: dict[str, float] = {}  # this step's: rollout/weight_sync_s, rollout/engine_start_s
        self.sync_count = 0
        _count_optimizer_steps()
        self._build()

    # ------------------------------------------------------------------ life cycle
    def _build(self) -> None:
        prepare_environment(self.settings.device)
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        t = time.perf_counter()
        try:
            if self._factory is None:
                import vllm

                self._factory = vllm.LLM
            self._llm = self._factory(**llm_kwargs(self.settings))
        except Exception as e:  # noqa: BLE001 -- any failure to start is the same message to the user
            self._dead = f"vLLM could not start: {type(e).__name__}: {e}"
            raise VllmEngineError(f"{self._dead}. Use rollout.engine=slimgrpo, or fix the cause above "
                                  "(docs/rollout.md#which-engine lists what vLLM needs).") from e
        finally:
            # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process (it expects a
            # process of its own): the trainer's (run.num_threads, one pool for both) is put back.
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self.metrics["rollout/engine_start_s"] = time.perf_counter() - t
        self._version = None

    def close(self) -> None:
        """Shut the engine down and free its weights and KV pool (idempotent; the next ``generate`` rebuilds)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception:  # noqa: BLE001 -- shutting down a broken engine must not mask the first error
                pass
        del llm
        gc.collect()

    def __del__(self) -> None:  # an unclosed engine frees its memory with the trainer
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ weights
    def sync_weights(self, force: bool = False) -> float:
        """Load the policy's current weights into the engine when they changed (or ``force``); seconds spent."""
        version = weights_version(self.model)
        if not force and version == self._version and not self._weights_dropped:
            return 0.0
        t = time.perf_counter()
        # Every tensor, each time: vLLM 0.32's in-place reload processes a layer (q/k/v fused into qkv_proj, ...)
        # from what it was given, and a layer given part of its weights samples wrongly (measured: LoRA on q/v
        # synced alone changed greedy output against the peft model; all weights matched it).
        self._call("syncing weights", lambda: self._reload(live_weights(self.model, changed_only=False)))
        self._version, self._weights_dropped = version, False
        self.sync_count += 1
        return time.perf_counter() - t

    def _reload(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        quiet = ExpectedReloadWarnings(ties_head(self.model))
        logger = logging.getLogger(RELOAD_LOGGER)
        logger.addFilter(quiet)
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        finally:
            logger.removeFilter(quiet)
        self._llm.collective_rpc(refresh_tied_head)
        self._llm.reset_prefix_cache()

    # ------------------------------------------------------------------ sampling
    def generate(self, prompt_ids: list[list[int]], num_generations: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        """Sample ``num_generations`` completions per prompt (``RolloutEngine``), on the current weights."""
        from .engine import _check_prompts

        _check_prompts(prompt_ids)
        if not isinstance(num_generations, int) or num_generations < 1:
            raise ValueError(f"num_generations must be a positive int, got {num_generations!r}")
        if self._dead:
            raise VllmEngineError(f"the vLLM engine stopped earlier ({self._dead}); the run cannot go on with it")
        if self._llm is None:
            self._build()
        self._wake()
        self.metrics["rollout/weight_sync_s"] = self.sync_weights()
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device).item()) \
            if generator is not None else None
        import vllm

        # Greedy: vLLM takes n=1 only; each prompt is sent G times (its prefix cache prefills it once).
        n, copies = (1, num_generations) if params.greedy else (num_generations, 1)
        sp = vllm.SamplingParams(**sampling_kwargs(params, n, seed))
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids for _ in range(copies)]
        outputs = self._call("sampling", lambda: self._llm.generate(prompts, sp, use_tqdm=False))
        self._sleep()
        device = next(self.model.parameters()).device
        return rollout_from_outputs(outputs, prompt_ids, num_generations, params, device)

    def _wake(self) -> None:
        if self._asleep:
            self._call("waking up", lambda: self._llm.wake_up())
            self._asleep = False

    def _sleep(self) -> None:
        """CUDA: give the weights and KV pool back to training until the next rollout (level 2: the weights are
        discarded; the next rollout syncs them whether or not the policy moved)."""
        if self.settings.sleep_mode:
            self._call("going to sleep", lambda: self._llm.sleep(level=2))
            self._asleep = self._weights_dropped = True

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine; a failure marks the engine dead and stops the run with what happened."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 -- vLLM raises many types (EngineDeadError, RuntimeError, ...)
            self._dead = f"{what} failed: {type(e).__name__}: {e}"
            raise VllmEngineError(
                f"the vLLM engine failed while {what} ({type(e).__name__}: {e}). The run stops here; checkpoints "
                "already saved are intact: run the same command again to resume from the last one (add "
                "rollout.engine=slimgrpo to go on without vLLM).") from e
