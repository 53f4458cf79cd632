"""The memory planner: a pure function from (model shape, run settings) to bytes per component.

    plan = plan_memory(load_shape("llama-3.1-8b"), RunSpec(device="cuda", lora=True, ...))
    plan.peak_bytes, plan.peak_phase, plan.components

A GRPO step has two memory phases on top of what is always resident:

    always      weights, adapters, optimizer state, reference copy (CPU runs), rollout and
                log-prob buffers, framework overhead
    generation  KV cache, per-step sampling logits, prompt prefill working set
    update      gradients, saved activations, attention mask, loss working set

    peak = always + max(generation, update)

Each stage writes the lines of what it allocates in its own ``costs.py`` (``forward/``, ``loss/``, ``update/``,
``rollout/``), with its constants beside the code they describe; this module adds the weights, the framework
and the tokenizer (``memory/footprint.py``), lets the lines that are alive at different moments overlap, shards
them under FSDP2 (``sharding.py``) and finds the peak. It also decides what the config leaves to the plan:
``tiled_mlp_on`` (``memory.tiled_mlp=auto``) and ``decode_packing`` (CPU float32 decoding).

Symbols as in ``runspec/cost.py``; the derivations are in docs/memory.md.
"""

from __future__ import annotations

import dataclasses
import math

from slimgrpo.forward.costs import NORM_BACKWARD_FP32_TENSORS, update_layer_bytes
from slimgrpo.loss.costs import loss_component, loss_kept_after
from slimgrpo.memory import attention as attn_kernels
from slimgrpo.memory.footprint import (CPU_FRAMEWORK_OVERHEAD_BYTES, CUDA_FRAMEWORK_OVERHEAD_BYTES,
                                       TOKENIZER_BYTES_PER_VOCAB, tokenizer_bytes)
from slimgrpo.plan.sharding import shard_components
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.rollout.costs import generation_components, small_projections, vllm_components, vllm_start_note
from slimgrpo.runspec.cost import (LORA_ADAPTER_BYTES, NF4_BYTES_PER_PARAM, PHASES, QLORA_COMPUTE_BYTES, Component,
                                after_freed, lora_num_params, num)
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.update.costs import (activation_components, buffer_components, critic_components, gradients_in_backward,
                                   offloads_to_host, optimizer_components, overlap_recompute, overlap_step_workspace)

__all__ = ["MemoryPlan", "decode_packing", "plan_memory", "resolve", "tiled_mlp_on"]

# memory.tiled_mlp=auto turns the tiled MLP on only where one update micro-batch runs at least this many
# tokens through each MLP and tiling lowers the planned peak by at least TILED_MLP_MIN_GAIN of it: shorter
# runs keep the untiled MLP (no extra MLP forward in backward; their plans and measurements do not move: the
# longest measured rows, docs/benchmarks.md, run 32,768-33,024 tokens per micro-batch). memory.fit's ladder
# turns it on below this where a budget needs it.
TILED_MLP_AUTO_TOKENS = 65_536
TILED_MLP_MIN_GAIN = 0.02


# ----------------------------------------------------------------------------------------------
# Component builders (each returns Components; plan_memory puts them together)
# ----------------------------------------------------------------------------------------------
def _weight_components(shape: ModelShape, x: RunSpec) -> list[Component]:
    N, Bp = shape.num_params, x.param_dtype_bytes
    out: list[Component] = []
    if x.load_in_4bit:
        quantised = shape.layers * shape.layer_linear_params
        rest = N - quantised
        b = math.ceil(quantised * NF4_BYTES_PER_PARAM) + rest * QLORA_COMPUTE_BYTES
        out.append(Component("weights", b, "always",
                             f"{num(quantised)} projection weights · {NF4_BYTES_PER_PARAM:.4f} B (NF4) + "
                             f"{num(rest)} others · {QLORA_COMPUTE_BYTES} B"))
    else:
        out.append(Component("weights", N * Bp, "always", f"N·{Bp} B = {num(N)}·{Bp}"))
    if x.lora:
        n = lora_num_params(shape, x.lora_rank, x.lora_target_modules)
        out.append(Component("LoRA adapters", n * LORA_ADAPTER_BYTES, "always",
                             f"L·Σ r·(in+out) · {LORA_ADAPTER_BYTES} B = {num(n)}·{LORA_ADAPTER_BYTES}"))

    if not x.needs_reference:
        out.append(Component("reference policy", 0, "always", "beta = 0: no reference model"))
    elif x.lora:
        out.append(Component("reference policy", 0, "always", "LoRA: base with adapters disabled, no copy"))
    elif x.device == "cuda" and x.reference_placement == "device":
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy kept on the device, N·{Bp} B = {num(N)}·{Bp}"))
    elif x.device == "cuda":
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy kept in host RAM, N·{Bp} B = {num(N)}·{Bp}",
                             location="host"))
        if x.reference_placement in ("stream", "auto"):
            out.append(_reference_stream_component(shape, x))
    else:
        out.append(Component("reference policy", N * Bp, "always",
                             f"full fine-tuning: frozen copy, N·{Bp} B = {num(N)}·{Bp}"))
    return out


def _reference_stream_component(shape: ModelShape, x: RunSpec) -> Component:
    """memory.reference_placement=stream (update/reference.py): during the reference pass the modules
    outside the decoder layers (embedding, head when untied, norms) and two layers (one computing, the next in
    flight) are on the device. The pass runs before the update, when its gradients and activations are not
    alive: plan_memory keeps only what exceeds them (``_overlap_reference_stream``)."""
    Bp, L = x.param_dtype_bytes, shape.layers
    layer = shape.layer_params
    rest = shape.num_params - L * layer
    resident = min(2, L)
    return Component("reference stream", (rest + resident * layer) * Bp, "update",
                     f"streamed reference: embedding/head/norms + {resident} layers, "
                     f"({num(rest)} + {resident}·{num(layer)})·{Bp} B")


def decode_packing(shape: ModelShape, x: RunSpec) -> str:
    """``x.decode_packing`` resolved: ``auto`` packs every projection for CPU float32 decoding ("all",
    ~1.5x decode throughput on SmolLM2) unless the projections are small (under ``generation.DECODE_PACK_MIN_BYTES``:
    oneDNN's cache of one kernel per weight shape and batch width then outweighs them) or packing raises
    the peak (the generation phase with the packed copies outgrows the update phase); then the LM head
    only ("head")."""
    if x.decode_packing != "auto":
        return x.decode_packing
    if x.device != "cpu" or x.param_dtype_bytes != 4:
        return "all"
    if small_projections(shape):
        return "head"
    all_plan = plan_memory(shape, dataclasses.replace(x, decode_packing="all"))
    head_plan = plan_memory(shape, dataclasses.replace(x, decode_packing="head"))
    return "all" if all_plan.peak_bytes <= head_plan.peak_bytes else "head"


def _notes(shape: ModelShape, x: RunSpec) -> list[str]:
    notes = []
    unknown = attn_kernels.kernel(x.attn_implementation)[1]
    if unknown:
        notes.append(unknown)
    if shape.max_positions and x.seq_len > shape.max_positions:
        notes.append(f"prompt + completion = {x.seq_len:,} tokens exceeds the model's position limit "
                     f"({shape.max_positions:,}, after rope scaling): `slimgrpo plan` and `train` refuse it")
    if x.offload_activations and x.device == "cpu":
        notes.append("offload_activations has no effect on cpu: host memory is the device; checkpoints stay in RSS")
    if x.micro_batch_rows > x.rows:
        notes.append(f"micro_batch_rows ({x.micro_batch_rows}) > rows per step ({x.rows}); using {x.rows}")
    return notes


def _overlap_reference_stream(weights: list[Component], update: list[Component]) -> list[Component]:
    """The streamed reference's device working set is alive during the reference pass, before the update's
    gradients and activations exist (they are freed at the end of every step): only what exceeds them adds."""
    held = sum(c.bytes for c in update if c.location == "device" and c.phase == "update")
    return after_freed(weights, "reference stream", held, "the update's gradients and activations")


def _tokenizer_component(shape: ModelShape, x: RunSpec) -> list[Component]:
    """CPU: the tokenizer's objects count in the process's RSS (formulas.TOKENIZER_BYTES_PER_VOCAB, measured);
    on CUDA they are host memory beside the device. Not a tensor: ``MemoryPlan.framework_bytes`` holds it."""
    if x.device != "cpu" or x.framework_overhead_bytes is not None:
        return []
    return [Component("tokenizer", tokenizer_bytes(shape.vocab), "always",
                      f"the run's tokenizer (vocabulary and merges, not tensors), V·{TOKENIZER_BYTES_PER_VOCAB:,} B = "
                      f"{num(shape.vocab)}·{TOKENIZER_BYTES_PER_VOCAB:,} (measured retained RSS, about 1 KB an entry)")]


def tiled_mlp_on(shape: ModelShape, inputs: RunSpec) -> bool:
    """Whether the run tiles its MLPs: ``on`` / ``off`` as set; ``auto`` when one update micro-batch runs at
    least TILED_MLP_AUTO_TOKENS tokens (m·S) through each MLP and the tiled plan's peak is lower than the
    untiled one's by at least TILED_MLP_MIN_GAIN of it (the MLP's intermediates are a peak)."""
    if inputs.tiled_mlp != "auto":
        return inputs.tiled_mlp == "on"
    if inputs.micro_rows * inputs.seq_len < TILED_MLP_AUTO_TOKENS:
        return False
    off = plan_memory(shape, dataclasses.replace(inputs, tiled_mlp="off")).peak_bytes
    on = plan_memory(shape, dataclasses.replace(inputs, tiled_mlp="on")).peak_bytes
    return on <= off * (1 - TILED_MLP_MIN_GAIN)


def resolve(shape: ModelShape, spec: RunSpec) -> RunSpec:
    """``spec`` with what it leaves to the plan decided as a run applies it: ``tiled_mlp`` on or off
    (``tiled_mlp_on``) and ``decode_packing`` (``decode_packing``)."""
    return dataclasses.replace(spec, decode_packing=decode_packing(shape, spec),
                               tiled_mlp="on" if tiled_mlp_on(shape, spec) else "off")


# ----------------------------------------------------------------------------------------------
# The planner
# ----------------------------------------------------------------------------------------------
def plan_memory(shape: ModelShape, inputs: RunSpec) -> MemoryPlan:
    """Bytes per component and the peak: always + max(generation, update).

    Pure: no torch, no file access; the same inputs always give the same plan.
    On cuda, components marked location="host" (offloaded checkpoints, the full-fine-tuning
    reference copy) go to ``host_bytes`` and not to the peak. On cpu everything counts in the peak
    (process RSS), which also holds the measured import footprint.
    """
    x = inputs
    if x.tiled_mlp == "auto":  # resolved here; the plan keeps the inputs as given
        x = dataclasses.replace(x, tiled_mlp="on" if tiled_mlp_on(shape, x) else "off")
    if x.decode_packing == "auto":
        x = dataclasses.replace(x, decode_packing=decode_packing(shape, x))
    overhead = x.framework_overhead_bytes
    if overhead is None:
        overhead = CUDA_FRAMEWORK_OVERHEAD_BYTES if x.device == "cuda" else CPU_FRAMEWORK_OVERHEAD_BYTES
        what = "CUDA context and workspaces" if x.device == "cuda" else "measured import RSS of torch+transformers"
    else:
        what = "given by framework_overhead_bytes"
    loss = loss_component(shape, x)
    tokens = update_layer_bytes(shape, x)[1]
    final_norm = tokens * ((4 + 2 * x.compute_bytes) * shape.hidden + 4)
    kept = loss_kept_after(shape, x)
    final_norm_backward = 4 * NORM_BACKWARD_FP32_TENSORS * shape.hidden * tokens
    activations = overlap_recompute(activation_components(shape, x), loss, final_norm, offloads_to_host(x), kept,
                                     final_norm_backward)
    optimizer = gradients_in_backward(shape, x, optimizer_components(shape, x), activations + [loss])
    optimizer = overlap_step_workspace(optimizer, activations + [loss])
    weights = _overlap_reference_stream(_weight_components(shape, x), optimizer + activations + [loss])
    components = shard_components(shape, x, [
        *weights,
        *optimizer,
        *activations,
        loss,
        *buffer_components(x),
        *critic_components(shape, x),
        *(vllm_components(shape, x) if x.rollout_engine == "vllm" else generation_components(shape, x)),
        Component("framework overhead", overhead, "always", what),
        *_tokenizer_component(shape, x),
    ])
    device = [c for c in components if c.location == "device"]
    totals = {p: sum(c.bytes for c in device if c.phase == p) for p in PHASES}
    peak_phase = "generation" if totals["generation"] > totals["update"] else "update"
    peak = totals["always"] + totals[peak_phase]
    host = sum(c.bytes for c in components if c.location == "host")
    notes = _notes(shape, x)
    start = vllm_start_note(x, totals["always"])
    if start:
        notes.append(start)
    if inputs.decode_packing == "auto" and x.decode_packing == "head" and x.device == "cpu" \
            and not small_projections(shape):
        notes.append("decode weights: the LM head only is packed for decoding (packing every projection, ~1.5x "
                     "faster decoding, would raise this plan's peak: generation sets it)")
    if inputs.tiled_mlp == "auto" and x.tiled_mlp == "on":
        notes.append(f"memory.tiled_mlp=auto: on (m·S = {num(x.micro_rows * x.seq_len)} tokens per MLP call, at least "
                     f"{num(TILED_MLP_AUTO_TOKENS)}, and it lowers the peak)")
    return MemoryPlan(shape=shape, inputs=inputs, components=components, peak_bytes=peak,
                      peak_phase=peak_phase, host_bytes=host, notes=notes)

