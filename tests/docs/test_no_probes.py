"""No probing of the project's own objects: every ``hasattr(x, name)`` and ``getattr(x, name, default)`` in
src/slimgrpo is listed here with the reason it is there.

A part of a run is built whole (``train/build.py``'s ``RunParts``) and a protocol names what its
implementations offer (``RolloutEngine``: ``off_policy``, ``metrics``, ``close``; ``output/backends.py``'s
``Backend``), so code never has to ask whether one of our objects has an attribute yet. What is left probes
objects that are not ours: transformers models and configs (attributes differ by architecture and
version), peft's layers, torch's wrappers and versions, a user's callables and data, argparse namespaces,
the standard library's platform-dependent calls. A new probe fails here until it is listed with its reason;
an entry whose probe is gone fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "slimgrpo"

HF = "a transformers model, config, cache or tokenizer: third-party, its attributes differ by architecture and version"
PEFT = "a peft model or LoRA layer: third-party, the attribute exists only on adapted modules or some peft versions"
TORCH = "torch: a DDP / FSDP2 wrapper, a DTensor, or an API that depends on the torch version"
THIRD = "another third-party object (vLLM, trackio, a YAML error): its API differs by version"
USER = "a user's object (reward function, tool, environment, reward model spec, dataset, callable): any type"
ARGS = "an argparse namespace: each subcommand defines its own arguments"
EXC = "any exception, ours or a library's: the optional details a few of ours carry"
OS = "the standard library's platform-dependent API (os on Linux / macOS)"
TYPING = "a typing construct or class in the config schema: not every one has a __name__"

# (file under src/slimgrpo, the call as ast.unparse writes it) -> why it may probe
ALLOWED: dict[tuple[str, str], str] = {
    # causal_lm.py
    ('causal_lm.py', "hasattr(model, 'disable_adapter')"): PEFT,
    ('causal_lm.py', "hasattr(model, 'get_base_model')"): PEFT,
    # checkpoint/format.py
    ('checkpoint/format.py', "getattr(result, 'unexpected_keys', [])"): TORCH,
    ('checkpoint/format.py', "hasattr(obj, '__tensor_flatten__')"): TORCH,
    # checkpoint/sharded.py
    ('checkpoint/sharded.py', "getattr(base.config, 'tie_word_embeddings', False)"): HF,
    # commands/cli.py
    ('commands/cli.py', "getattr(args, 'algorithm', 'grpo')"): ARGS,
    ('commands/cli.py', "getattr(args, 'task', 'addition')"): ARGS,
    ('commands/cli.py', "getattr(e, 'exit_code', exit_codes.BAD_INPUT)"): EXC,
    ('commands/cli.py', "getattr(e, 'traceback_text', None)"): EXC,
    ('commands/cli.py', "hasattr(args, 'overrides')"): ARGS,
    # commands/plan.py
    ('commands/plan.py', "getattr(args, 'longest', False)"): ARGS,
    ('commands/plan.py', "getattr(args, 'nproc', 1)"): ARGS,
    ('commands/plan.py', "getattr(args, 'trace', False)"): ARGS,
    # commands/report.py
    ('commands/report.py', "getattr(args, 'out', None)"): ARGS,
    ('commands/report.py', "getattr(args, 'run_dirs', None)"): ARGS,
    ('commands/report.py', "getattr(args, 'x', 'step')"): ARGS,
    # commands/train.py
    ('commands/train.py', "getattr(args, 'from_command_line', False)"): ARGS,
    # config/best.py
    ('config/best.py', "getattr(spec, '__name__', type(spec).__name__)"): USER,
    ('trl/grpo.py', 'getattr(peft_config, name, fine)'): PEFT,
    ('trl/yaml.py', "getattr(config, 'model_type', None)"): HF,
    ('trl/yaml.py', "getattr(model, 'config', None)"): HF,
    ('config/best.py', "hasattr(spec, 'config')"): USER,
    ('config/best.py', "hasattr(spec, 'forward')"): USER,
    # config/parse.py
    ('config/parse.py', "getattr(config, 'name_or_path', '')"): USER,
    ('config/parse.py', "getattr(e, 'problem', None)"): THIRD,
    ('config/parse.py', "getattr(e, 'problem_mark', None)"): THIRD,
    ('config/parse.py', "getattr(value, '__module__', None)"): USER,
    ('config/parse.py', "getattr(value, '__name__', type(value).__name__)"): USER,
    ('config/parse.py', "getattr(value, '__qualname__', None)"): USER,
    ('config/parse.py', "getattr(value, 'config', None)"): USER,
    ('config/parse.py', "hasattr(value, 'column_names')"): USER,
    ('config/parse.py', "hasattr(value, 'forward')"): USER,
    # config/schema.py
    ('config/schema.py', "getattr(tp, '__name__', str(tp))"): TYPING,
    # data.py
    ('data.py', "getattr(tokenizer, 'chat_template', None)"): HF,
    ('data.py', "hasattr(data, 'to_list')"): USER,
    # distributed/context.py
    ('distributed/context.py', "getattr(model, 'module', None)"): TORCH,
    # distributed/process_group.py
    ('distributed/process_group.py', "getattr(obj, '__qualname__', None)"): USER,
    # distributed/wrap.py
    ('distributed/wrap.py', "getattr(base, '_no_split_modules', None)"): HF,
    ('distributed/wrap.py', "getattr(decoder, 'layers', [])"): HF,
    ('distributed/wrap.py', "hasattr(base, 'get_decoder')"): HF,
    # forward/gather.py
    ('forward/gather.py', "getattr(cache, 'layers', None)"): HF,
    ('forward/gather.py', "getattr(layer, 'keys', None)"): HF,
    ('forward/gather.py', "getattr(layer, 'values', None)"): HF,
    # forward/rows.py
    ('forward/rows.py', "getattr(config, 'final_logit_softcapping', None)"): HF,
    ('forward/rows.py', "getattr(config, 'get_text_config', None)"): HF,
    ('forward/rows.py', "getattr(config, 'logit_scale', None)"): HF,
    ('forward/rows.py', "getattr(config, 'logits_scaling', None)"): HF,
    ('forward/rows.py', "getattr(head, 'bias', None)"): HF,
    ('forward/rows.py', "getattr(head, 'disable_adapters', False)"): PEFT,
    ('forward/rows.py', "getattr(head, 'weight', None)"): HF,
    ('forward/rows.py', "getattr(model, 'config', None)"): HF,
    ('forward/rows.py', "hasattr(head, 'base_layer')"): PEFT,
    ('forward/rows.py', "hasattr(head, 'modules_to_save')"): PEFT,
    ('forward/rows.py', "hasattr(head, 'original_module')"): PEFT,
    ('forward/rows.py', "hasattr(lm, 'get_output_embeddings')"): HF,
    # forward/packed.py
    ('forward/packed.py', "getattr(config, '_attn_implementation', None)"): HF,
    ('forward/packed.py', "getattr(config, 'head_dim', None)"): HF,
    ('forward/packed.py', "getattr(config, 'layer_types', None)"): HF,
    ('forward/packed.py', "getattr(config, 'model_type', None)"): HF,
    ('forward/packed.py', "getattr(config, 'num_key_value_heads', heads)"): HF,
    ('forward/packed.py', "getattr(config, 'sliding_window', None)"): HF,
    ('forward/packed.py', "getattr(lm.config, '_attn_implementation', None)"): HF,
    # forward/shared_prompt.py
    ('forward/shared_prompt.py', "getattr(m, 'gradient_checkpointing', False)"): HF,
    ('forward/shared_prompt.py', "hasattr(m, '_fsdp_state')"): TORCH,
    # model_gguf.py
    ('model_gguf.py', 'hasattr(model.config, attr)'): HF,
    # modeling.py
    ('modeling.py', "getattr(getattr(unwrap_causal_lm(model), 'generation_config', None), 'eos_token_id', None)"): HF,
    ('modeling.py', "getattr(unwrap_causal_lm(model), 'generation_config', None)"): HF,
    ('modeling.py', "hasattr(p, 'full_tensor')"): TORCH,
    # output/backends.py
    ('output/backends.py', "getattr(self.trackio, 'Table', None)"): THIRD,
    # output/metrics.py
    ('output/metrics.py', "hasattr(torch.cuda, 'host_memory_stats')"): TORCH,
    # forward/layout.py
    ('forward/layout.py', "getattr(lm.config, '_attn_implementation', None)"): HF,
    # rewards/contract.py
    ('rewards/contract.py', "getattr(kwargs.get(key), '__self__', None)"): USER,
    ('rewards/contract.py', "hasattr(value, 'item')"): USER,
    ('rewards/contract.py', "hasattr(values, 'tolist')"): USER,
    # rewards/loading.py
    ('rewards/loading.py', "getattr(obj, '__dict__', {})"): USER,
    ('rewards/loading.py', "getattr(obj, '__module__', None)"): USER,
    ('rewards/loading.py', "getattr(obj, '__name__', None)"): USER,
    ('rewards/loading.py', "getattr(obj, '__name__', repr(obj))"): USER,
    ('rewards/loading.py', "getattr(spec, '__name__', type(spec).__name__)"): USER,
    ('rewards/loading.py', "getattr(v, '__module__', None)"): USER,
    ('rewards/loading.py', 'hasattr(obj, part)'): USER,
    ('rewards/loading.py', "hasattr(spec, 'config')"): USER,
    ('rewards/loading.py', "hasattr(spec, 'forward')"): USER,
    # rewards/process_call.py
    ('rewards/process_call.py', "getattr(fn, '__module__', None)"): USER,
    ('rewards/process_call.py', "getattr(module, '__file__', None)"): USER,
    ('rewards/process_call.py', "getattr(type(fn), '__module__', '')"): USER,
    ('rewards/process_call.py', "hasattr(fn, '__qualname__')"): USER,
    # rewards/reward_model.py
    ('rewards/reward_model.py', "getattr(model.config, '_name_or_path', '')"): HF,
    ('rewards/reward_model.py', "getattr(model.config, 'name_or_path', '')"): USER,
    ('rewards/reward_model.py', "hasattr(model.config, 'get_text_config')"): HF,
    # rewards/scoring.py
    ('rewards/scoring.py', "getattr(fn, '__name__', 'fn')"): USER,
    ('rewards/scoring.py', "getattr(values, 'ndim', None)"): USER,
    ('rewards/scoring.py', "hasattr(values, 'tolist')"): USER,
    # agent/setup.py
    ('agent/setup.py', "getattr(tokenizer, 'chat_template', None)"): HF,
    # rollout/cuda_graph.py
    ('rollout/cuda_graph.py', "hasattr(parts.config, 'get_text_config')"): HF,
    # agent/environments.py
    ('agent/environments.py', "getattr(instance, 'get_reward', None)"): USER,
    ('agent/environments.py', "getattr(instance, 'reset', None)"): USER,
    # rollout/graph_cache.py
    ('rollout/graph_cache.py', "getattr(m, 'active_adapters', ())"): PEFT,
    ('rollout/graph_cache.py', "getattr(m, 'disable_adapters', False)"): PEFT,
    ('rollout/graph_cache.py', "getattr(m, 'merged_adapters', ())"): PEFT,
    ('rollout/graph_cache.py', "getattr(m, 'scaling', {})"): PEFT,
    ('rollout/graph_cache.py', "hasattr(m, 'lora_A')"): PEFT,
    # rollout/llama_stepper.py
    ('rollout/llama_stepper.py', "getattr(config, 'layer_types', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(config, 'model_type', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(config, 'partial_rotary_factor', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(config, 'rope_parameters', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(config, 'rope_scaling', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(config, 'sliding_window', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(first, 'scaling', self.head_dim ** (-0.5))"): HF,
    ('rollout/llama_stepper.py', "getattr(l.mlp, 'gate_proj', None)"): HF,
    ('rollout/llama_stepper.py', "getattr(l.mlp, 'up_proj', None)"): HF,
    ('rollout/llama_stepper.py', 'hasattr(decoder, name)'): HF,
    ('rollout/llama_stepper.py', "hasattr(first, 'k_norm')"): HF,
    ('rollout/llama_stepper.py', "hasattr(first, 'q_norm')"): HF,
    ('rollout/llama_stepper.py', "hasattr(m, '_fsdp_state')"): TORCH,
    ('rollout/llama_stepper.py', 'hasattr(mlp, name)'): HF,
    ('rollout/llama_stepper.py', "hasattr(parts.config, 'get_text_config')"): HF,
    # rollout/model_parts.py
    ('rollout/model_parts.py', "getattr(config, 'final_logit_softcapping', None)"): HF,
    ('rollout/model_parts.py', "getattr(config, 'logit_scale', None)"): HF,
    ('rollout/model_parts.py', "getattr(config, 'logits_scaling', None)"): HF,
    ('rollout/model_parts.py', "getattr(module, 'active_adapters', [])"): PEFT,
    ('rollout/model_parts.py', "getattr(module, 'base_layer', None)"): PEFT,
    ('rollout/model_parts.py', "getattr(module, 'disable_adapters', False)"): PEFT,
    ('rollout/model_parts.py', "getattr(module, 'fan_in_fan_out', False)"): PEFT,
    ('rollout/model_parts.py', "getattr(module, 'merged', False)"): PEFT,
    ('rollout/model_parts.py', "getattr(module, 'use_dora', {})"): PEFT,
    ('rollout/model_parts.py', 'getattr(module, n, None)'): HF,
    ('rollout/model_parts.py', "hasattr(base, 'get_decoder')"): HF,
    ('rollout/model_parts.py', "hasattr(base, 'get_output_embeddings')"): HF,
    ('rollout/model_parts.py', "hasattr(base.config, 'get_text_config')"): HF,
    ('rollout/model_parts.py', "hasattr(base.weight, 'device_mesh')"): TORCH,
    ('rollout/model_parts.py', "hasattr(m, 'base_layer')"): PEFT,
    ('rollout/model_parts.py', "hasattr(module, 'get_delta_weight')"): PEFT,
    ('rollout/model_parts.py', "hasattr(module, 'lora_A')"): PEFT,
    ('rollout/model_parts.py', "hasattr(weight, 'device_mesh')"): TORCH,
    # agent/tool_calls.py
    ('agent/tool_calls.py', "getattr(fn, '__call__', None)"): USER,
    ('agent/tool_calls.py', "getattr(fn, '__name__', type(fn).__name__)"): USER,
    # rollout/vllm_engine.py
    ('rollout/vllm_engine.py', "getattr(getattr(llm, 'llm_engine', None), 'engine_core', None)"): THIRD,
    ('rollout/vllm_engine.py', "getattr(getattr(model, 'model', None), 'embed_tokens', None)"): HF,
    ('rollout/vllm_engine.py', "getattr(llm, 'llm_engine', None)"): THIRD,
    ('rollout/vllm_engine.py', "getattr(m, 'active_adapters', [])"): PEFT,
    ('rollout/vllm_engine.py', "getattr(m, 'disable_adapters', False)"): PEFT,
    ('rollout/vllm_engine.py', "getattr(m.base_layer, 'bias', None)"): PEFT,
    ('rollout/vllm_engine.py', "getattr(model, 'lm_head', None)"): HF,
    ('rollout/vllm_engine.py', "getattr(model, 'model', None)"): HF,
    ('rollout/vllm_engine.py', "getattr(model_config, 'head_dim', None)"): HF,
    ('rollout/vllm_engine.py', "getattr(model_config, 'num_key_value_heads', None)"): HF,
    ('rollout/vllm_engine.py', "hasattr(core, 'shutdown')"): THIRD,
    ('rollout/vllm_engine.py', "hasattr(m, 'base_layer')"): PEFT,
    ('rollout/vllm_engine.py', "hasattr(m, 'get_delta_weight')"): PEFT,
    ('rollout/vllm_engine.py', "hasattr(m, 'lora_A')"): PEFT,
    # threads.py
    ('threads.py', "hasattr(os, 'getloadavg')"): OS,
    ('threads.py', "hasattr(os, 'sched_getaffinity')"): OS,
    # trace/standins.py
    ('trace/standins.py', 'getattr(module, name, None)'): HF,
    # forward/layout.py
    ('forward/layout.py', "getattr(model, 'module', model)"): TORCH,
    # update/reference.py
    # update/updater.py
    ('update/updater.py', "getattr(self.model, 'no_sync', None)"): TORCH,
}


def probes(src: Path = SRC) -> set[tuple[str, str]]:
    """Every ``hasattr(...)`` and three-argument ``getattr(...)`` call under ``src``: (file, call)."""
    found = set()
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                    node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3)):
                found.add((path.relative_to(src).as_posix(), ast.unparse(node)))
    return found


def test_every_probe_is_listed_with_its_reason():
    unlisted = sorted(probes() - set(ALLOWED))
    assert not unlisted, ("hasattr / getattr(x, name, default) not in ALLOWED: give our objects the attribute "
                          "(a protocol, a field set in __init__, a part built whole), or list a third-party "
                          f"probe with its reason: {unlisted}")


def test_no_listed_probe_is_gone():
    gone = sorted(set(ALLOWED) - probes())
    assert not gone, f"listed in ALLOWED but no longer in the source (drop the entries): {gone}"


def test_the_trainer_and_its_helpers_probe_nothing():
    """The run's own code (the trainer, the build, the runner, the evaluator, the console) asks no object
    whether it has an attribute."""
    mine = ("train/", "evaluate/during.py", "output/console.py", "output/metrics.py", "agent/setup.py")
    assert not [p for p in probes() if p[0].startswith(mine)
                and ALLOWED.get(p) not in (HF, TORCH)], "the run's own code probes its own parts"


def test_probes_are_found(tmp_path):
    (tmp_path / "a.py").write_text("hasattr(x, 'y')\ngetattr(x, 'y')\ngetattr(x, 'z', None)\n")
    assert probes(tmp_path) == {("a.py", "hasattr(x, 'y')"), ("a.py", "getattr(x, 'z', None)")}
