"""``slimgrpo plan --trace``: one real GRPO step of a config, at full size, on fake tensors.

    from slimgrpo.plan import trace_config        # the spec resolved as a run resolves it
    result = trace_config(cfg, load_shape("llama-3.1-8b"), device="cuda")
    result.peak_bytes, result.phases["update"].by_tag

The model is built on the ``meta`` device and materialised with ``to_empty`` inside
``FakeTensorMode``: every tensor has its real shape, dtype and storage size and no data, so no memory
is allocated and no GPU is needed. Then the trainer's own code runs, under a
:class:`~slimgrpo.trace.live_bytes.LiveBytes` tracker, its rollout engine and update built with a simulated
``DeviceTarget`` of the spec's device (``slimgrpo/target.py``), so every choice the step makes by device (LoRA
merge and weight packing in the rollout, the offload path) is the one a run on that device makes:

* **resident**: weights (LoRA adapters apart), the full-fine-tuning reference copy, optimizer state
  (created by one warm-up step before tracking, as every step after a run's first has it), the
  rollout's tensors;
* **generation**: the rollout engine (``TorchRolloutEngine``) prefills the prompts and runs
  ``decode_steps`` decode steps, then stops. The lean decoder preallocates its KV cache for the whole
  completion, so its full size is live from the first step; the per-step working set repeats;
* **update**: the trainer's update stage (``update.Updater``: ``prepare`` and ``step``) on synthetic
  full-length completions
  (``trace/synthetic.py``): reference / old log-probs, micro-batched forward and backward through the
  real loss with checkpointing / LoRA / shared prompts as configured, gradient clipping, optimizer step.

Tags (what ``by_tag`` holds): ``weights``, ``LoRA adapters``, ``reference policy``, ``optimizer
state``, ``buffers`` (rollout tensors), ``generation`` (KV cache, prefill, sampling), ``activations``
(made inside the decoder's forward), ``loss working set`` (made after the decoder, in the forward:
LM head chunks, objective), ``backward`` (made during backward: activation gradients, recomputed
layers), ``gradients`` (parameter ``.grad``), ``optimizer step``, ``update other``. On CUDA,
``offloaded checkpoints`` (``memory.offload_activations``) and ``reference policy`` are host memory
(``HOST_TAGS``): counted apart from the device peak, in ``TraceResult.host_peak_bytes``.

What the trace cannot see: the allocator's caching and fragmentation (CUDA caching allocator, glibc
heaps), workspaces libraries take outside PyTorch tensors (cuBLAS, cuDNN, oneDNN packed weights,
NCCL), kernels that allocate internally, the CUDA context and the Python / torch runtime. The
kernels traced are CPU's: ``sdpa`` without a mask runs the flash kernel (saves output + log-sum-exp,
as CUDA's flash / memory-efficient kernels do), ``eager`` saves the attention matrix. On CPU the
runtime is ``memory.footprint.cpu_runtime_bytes`` (the imports and the tokenizer, measured); on CUDA we add
``CUDA_FRAMEWORK_OVERHEAD_BYTES``
and a margin of ``CUDA_TRACE_MARGIN`` of the traced peak for the allocator (an assumption until a GPU
run measures it: ``python -m benchmarks.gpu.suite``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field

import torch

from slimgrpo.memory.attention import cpu_gqa
from slimgrpo.memory.footprint import CUDA_FRAMEWORK_OVERHEAD_BYTES, cpu_runtime_bytes
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.target import DeviceTarget
from slimgrpo.trace.live_bytes import LiveBytes, PhasePeak

# Caching allocator rounding, fragmentation and stream-ordered reuse on CUDA, as a fraction of the tensor
# peak: what the trace adds for its device peak (trace/step.py), and the least headroom `slimgrpo plan`
# asks of a budget before it says "fits" without a warning. A documented guess (docs/memory.md#trace), to be
# replaced by the measured max_memory_reserved / traced ratio of the GPU suite.
CUDA_TRACE_MARGIN = 0.10

# Tags of what a CUDA run holds in host memory, not on the GPU: counted apart (TraceResult.host_peak_bytes).
HOST_TAGS = ("offloaded checkpoints", "reference policy")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class TraceResult:
    """Live tensor bytes of one traced step."""

    phases: dict[str, PhasePeak]  # "generation" (when traced) and "update": peak and its breakdown
    peak_bytes: int  # largest live tensor total of the step
    peak_phase: str
    device: str
    overhead_bytes: int  # what the trace cannot see, added for the device peak (see module docstring)
    margin_bytes: int  # CUDA allocator margin (0 on cpu)
    kv_bytes: int = 0  # live generation tensors at the last traced decode step: KV cache and output buffers
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    host_peak_bytes: int = 0  # cuda: most bytes held in host memory at once (offloaded checkpoints, reference copy)

    @property
    def device_peak_bytes(self) -> int:
        """The traced peak plus what the trace cannot see: compare with peak RSS / nvidia-smi."""
        return self.peak_bytes + self.overhead_bytes + self.margin_bytes


class _EnoughDecoding(Exception):
    """Raised from inside the rollout engine once the traced decode steps are done."""


def compute_dtype(cfg, device: str) -> torch.dtype:
    if cfg.model.dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return DTYPES[cfg.model.dtype]


def meta_model(shape: ModelShape, dtype: torch.dtype, attn_implementation: str = "sdpa"):
    """A causal LM of ``shape`` on the ``meta`` device (build it outside ``FakeTensorMode``)."""
    from slimgrpo.trace.synthetic import random_causal_lm

    return random_causal_lm(shape, dtype, "meta", attn_implementation=attn_implementation)


def materialise(model):
    """``to_empty`` inside an active ``FakeTensorMode``: fake tensors of the real sizes; tied heads
    re-tied (``to_empty`` makes new parameters)."""
    model = model.to_empty(device="cpu")
    model.tie_weights()
    return model


def trace_step(cfg, shape: ModelShape, spec: RunSpec, generation: bool = True, decode_steps: int = 2) -> TraceResult:
    """Trace one step of ``cfg`` for a model of ``shape`` (``cfg.model.path`` is not read) on the device of
    ``spec``, the run's spec with its choices resolved (``plan.model.resolve``: the tiled MLP, the decode packing;
    ``plan.trace_config`` makes both from a config). Its prompts are ``cfg``'s data.max_prompt_length long."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from slimgrpo.trace.fake_data import FakeData

    device = spec.device
    t0 = time.perf_counter()
    notes: list[str] = []
    # On CUDA these live in host memory (as the plan's location="host" lines): counted apart from the device peak
    host_tags = HOST_TAGS if device == "cuda" else ()
    if cfg.memory.reference_placement == "device":  # the copy kept on the GPU, as the plan's line
        host_tags = tuple(t for t in host_tags if t != "reference policy")
        notes.append("memory.reference_placement=device: the reference copy counted on the device")
    tracker = LiveBytes(default_tag="update other", host_tags=host_tags)
    meta, reference = _prepared_meta(cfg, shape, spec, notes)
    if cfg.memory.optimizer == "adamw_8bit":
        notes.append("8-bit AdamW: a stand-in keeps bitsandbytes' blockwise state (two uint8 moments, fp32 "
                     "absmax per 256) and steps in place like its fused kernel (trace/standins.py)")
    # Every choice that shapes the step's memory follows the device traced for, not the fake tensors' CPU device
    # (slimgrpo/target.py): a CUDA trace decodes LoRA without the CPU's merged weights, packs nothing.
    target = DeviceTarget(device, host=lambda: tracker.tag("offloaded checkpoints"), simulated=True)
    with cpu_gqa(device), FakeTensorMode(allow_non_fake_inputs=True), FakeData():
        runner, model = _build(cfg, meta, reference, spec, target)
        with tracker:
            _track_resident(tracker, runner, cfg)
            if generation:
                kv = _trace_generation(tracker, model, cfg, shape, spec, target, decode_steps, notes)
            else:
                kv = 0
            _trace_update(tracker, runner, cfg, shape)
    phase = max(tracker.phases, key=lambda p: tracker.phases[p].peak_bytes)
    overhead = CUDA_FRAMEWORK_OVERHEAD_BYTES if device == "cuda" else cpu_runtime_bytes(shape.vocab)
    margin = math.ceil(CUDA_TRACE_MARGIN * tracker.peak_bytes) if device == "cuda" else 0
    return TraceResult(dict(tracker.phases), tracker.peak_bytes, phase, device, overhead, margin, kv,
                       time.perf_counter() - t0, notes, tracker.host_peak_bytes)


def _prepared_meta(cfg, shape: ModelShape, spec: RunSpec, notes: list[str]):
    """The policy on ``meta``, through ``prepare_for_training`` (LoRA, checkpointing, dropout), and the
    full-fine-tuning reference copy (``beta > 0``) as a second ``meta`` model: peft and ``deepcopy``
    cannot move fake parameters, so everything is prepared before it is materialised."""
    from slimgrpo.modeling import prepare_for_training

    device = spec.device
    dtype, attn = compute_dtype(cfg, device), cfg.model.attn_implementation or "sdpa"
    if attn == "flash_attention_2":  # CUDA-only kernel; CPU sdpa without a mask saves what it saves
        attn = "sdpa"
        notes.append("flash_attention_2 traced as sdpa's flash kernel: both save output + log-sum-exp, no S² tensor")
    model = meta_model(shape, dtype, attn)
    if cfg.model.load_in_4bit:
        from slimgrpo.trace.standins import quantize_standin

        model = quantize_standin(model)  # then apply_lora freezes it (modeling.prepare_quantized_base)
        notes.append("4-bit base: a stand-in stores each projection as bitsandbytes NF4 does (packed 4-bit, "
                     "absmax per 64, double-quantised) and dequantises it to the compute dtype per matmul "
                     "(trace/standins.py)")
    model, _ = prepare_for_training(model, dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, beta=0.0)))
    _tile(spec, model, notes)
    reference = None
    if cfg.loss.beta > 0 and not cfg.lora.enabled:
        reference = meta_model(shape, dtype, attn).eval().requires_grad_(False)
    if cfg.memory.offload_activations and device == "cuda":
        notes.append("offload_activations: traced on the CUDA code path (update/offload.py): each offloaded tensor "
                     "is counted in host memory while it waits for backward, and as a device copy once it is back")
    return model, reference


def _tile(spec: RunSpec, model, notes: list[str]) -> None:
    """memory.tiled_mlp as the run applies it (the resolved spec's ``tiled_mlp``; all MLPs or none)."""
    from slimgrpo.memory.tiled_mlp import tile_mlps, untile_mlps

    if spec.tiled_mlp != "on":
        return
    report = tile_mlps(model)
    if report.complete:
        notes.append(f"tiled MLP: {report.tiled} MLPs run ceil(tokens / hidden) shards, each recomputed in backward "
                     "(memory/tiled_mlp.py)")
    else:
        untile_mlps(model)
        notes.append(f"tiled MLP asked for, but cannot tile {'; '.join(report.unknown)}: traced untiled")


def _build(cfg, model, reference, spec: RunSpec, target: DeviceTarget):
    """Materialise the prepared meta models (inside ``FakeTensorMode``) and build the trainer's update."""
    from slimgrpo.trace.synthetic import UpdateOnly

    model = materialise(model)
    reference = materialise(reference) if reference is not None else None
    eight_bit = cfg.memory.optimizer == "adamw_8bit"
    if eight_bit:  # bitsandbytes (CUDA) and torchao (torch.compile) cannot run here: a stand-in of its memory
        cfg = dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, optimizer="adamw"))
    runner = UpdateOnly(cfg, model, device="cpu", prepared=True, reference_cpu=reference, spec=spec, target=target)
    if eight_bit:
        from slimgrpo.trace.standins import AdamW8bitStandIn

        runner.updater.optimizer = AdamW8bitStandIn(runner.policy.trainable_parameters(), cfg.optim.learning_rate)
    optimizer = runner.updater.optimizer
    for p in runner.policy.trainable_parameters():  # the optimizer state exists from a run's second step on
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return runner, runner.model


def _track_resident(tracker: LiveBytes, runner, cfg) -> None:
    for p in runner.model.parameters():
        tracker.track(p, "LoRA adapters" if (cfg.lora.enabled and p.requires_grad) else "weights")
    tracker.track_all(runner.model.buffers(), "weights")
    if runner.policy.reference_cpu is not None:
        tracker.track_all(runner.policy.reference_cpu.parameters(), "reference policy")
        tracker.track_all(runner.policy.reference_cpu.buffers(), "reference policy")
    for state in runner.updater.optimizer.state.values():
        tracker.track_all(_tensors_of(state), "optimizer state")


def _tensors_of(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_of(v)


def _trace_generation(tracker: LiveBytes, model, cfg, shape: ModelShape, spec: RunSpec, target: DeviceTarget,
                      decode_steps: int, notes: list[str]) -> int:
    from slimgrpo.rollout.engine import TorchRolloutEngine
    from slimgrpo.rollout.model_parts import CausalLMParts
    from slimgrpo.rollout.sampling import SamplingParams

    r = cfg.rollout
    engine = TorchRolloutEngine(CausalLMParts(model, target), max_batch_rows=r.max_batch_rows,  # as train/build.py
                                kv_cache_dtype=r.kv_cache_dtype, pack_weights=spec.decode_packing)
    calls = {"n": 0, "kv": 0}
    logits = engine.parts.logits

    def counting_logits(hidden):  # the prefill's logits, then one call per decode step
        calls["n"] += 1
        if calls["n"] > decode_steps:
            calls["kv"] = tracker.live_bytes("generation")
            raise _EnoughDecoding
        return logits(hidden)

    engine.parts.logits = counting_logits
    params = SamplingParams(max_new_tokens=r.max_completion_length, min_new_tokens=r.max_completion_length,
                            temperature=r.temperature or 1.0, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                            repetition_penalty=r.repetition_penalty, eos_token_ids=(1,), pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, shape.vocab, (cfg.prompts_per_step, cfg.data.max_prompt_length), generator=g)
    tracker.set_tag("generation")
    with tracker.phase("generation"):
        with contextlib.suppress(_EnoughDecoding):
            engine.generate(prompts.tolist(), r.num_generations, params, generator=g)
    tracker.set_tag("update other")
    if calls["n"] <= decode_steps:
        notes.append("generation ended before the traced decode steps")
    return calls["kv"]


def _trace_update(tracker: LiveBytes, runner, cfg, shape: ModelShape) -> None:
    from slimgrpo.causal_lm import unwrap_causal_lm
    from slimgrpo.trace.synthetic import synthetic_advantages, synthetic_rollout

    optimizer = runner.updater.optimizer
    with tracker.tag("buffers"):
        rollout = synthetic_rollout(cfg.prompts_per_step, cfg.rollout.num_generations, cfg.data.max_prompt_length,
                                    cfg.rollout.max_completion_length, shape.vocab)
        advantages = synthetic_advantages(rollout.rows, rollout.num_generations)
    decoder = unwrap_causal_lm(runner.model).get_decoder()
    handles = [
        decoder.register_forward_pre_hook(lambda *_: tracker.set_tag("activations")),
        decoder.register_forward_hook(lambda *_: tracker.set_tag("loss working set")),
        optimizer.register_step_pre_hook(lambda *_: tracker.set_tag("optimizer step")),
        optimizer.register_step_post_hook(lambda *_: tracker.set_tag("update other")),
    ]
    for p in runner.policy.trainable_parameters():
        handles.append(p.register_post_accumulate_grad_hook(lambda p: tracker.retag(p.grad, "gradients")))
    try:
        with tracker.phase("update"):
            runner.step(rollout, advantages)
    finally:
        for h in handles:
            h.remove()
        tracker.set_tag("update other")

