"""One rule per key of the YAML that TRL 1.16's ``trl grpo`` CLI reads: mapped onto slimgrpo keys, ignored
(with the reason), or refused unless left at a value that changes nothing.

The keys are the fields of ``GRPOConfig`` (including every inherited ``transformers.TrainingArguments``
field), ``ModelConfig``, ``ScriptArguments``/``GRPOScriptArguments`` and ``DatasetMixtureConfig``, the own
fields of TRL 1.12's ``PPOConfig`` (``slimgrpo.trl.PPOTrainer``), plus a few older names users still write
(``torch_dtype``, ``warmup_ratio``, ``max_prompt_length``). A test checks
that every field of those TRL dataclasses has a rule, and docs/trl-migration.md is generated from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# TRL defaults the conversion needs when a YAML leaves a key out (checked against trl by the tests).
TRL_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_train_epochs": 3.0, "max_steps": -1,
    "logging_steps": 10, "output_dir": None, "eval_steps": None,
    "max_completion_length": 512, "lr_scheduler_type": "linear", "adam_beta2": 0.999, "gradient_checkpointing": True,
    "save_steps": 500, "lora_dropout": 0.05, "lora_target_modules": None,
}
# Where a TRL script or YAML is silent, these take TRL's value, not slimgrpo's own default (a TRL name means TRL's
# behaviour): what is learnt (completion length, schedule, Adam's beta2, LoRA's dropout and targets, the last two
# with use_peft) and what the run does on the side (checkpointing, the console line, checkpoints every 500 steps).
# The rest of slimgrpo's defaults that differ from TRL's stay, each for a reason docs/trl-migration.md gives.
TRL_DEFAULTS_APPLIED = ("max_completion_length", "lr_scheduler_type", "adam_beta2", "gradient_checkpointing",
                        "logging_steps", "save_steps")
TRL_LORA_DEFAULTS_APPLIED = ("lora_dropout", "lora_target_modules")

SKIP = object()  # a transform's answer: this value changes nothing in slimgrpo


class Refused(ValueError):
    """This value of a TRL key has no slimgrpo equivalent."""


@dataclass(frozen=True)
class Rule:
    key: str  # the TRL key
    kind: str  # "map" | "ignore" | "refuse"
    targets: tuple[str, ...] = ()  # slimgrpo keys it sets (map)
    note: str = ""  # map: how values translate / defaults that differ; ignore/refuse: the reason
    transform: Callable[[Any, dict], Any] | None = None  # (value, whole TRL dict) -> value | {key: value} | SKIP
    ok: tuple = (None,)  # refuse: values accepted silently (TRL's default, or values that change nothing)
    source: str = "GRPOConfig"  # which TRL dataclass holds the key (docs)

    def apply(self, value: Any, trl: dict) -> dict[str, Any]:
        """slimgrpo ``{dotted_key: value}`` for this TRL value; raises Refused."""
        if self.kind == "ignore":
            return {}
        if self.kind == "refuse":
            if _same(value, self.ok):
                return {}
            raise Refused(self.note)
        out = self.transform(value, trl) if self.transform else value
        if out is SKIP:
            return {}
        return out if isinstance(out, dict) else {self.targets[0]: out}


def _same(value: Any, ok: tuple) -> bool:
    return any(value == o or (o is None and value in ({}, [], "")) for o in ok)


def M(key, target, note="", transform=None, targets=(), source="GRPOConfig") -> Rule:
    return Rule(key, "map", (target, *targets) if target else tuple(targets), note, transform, source=source)


def I(key, reason, source="TrainingArguments") -> Rule:
    return Rule(key, "ignore", note=reason, source=source)


def R(key, reason, ok=(None,), source="TrainingArguments") -> Rule:
    return Rule(key, "refuse", note=reason, ok=tuple(ok), source=source)


# ----------------------------------------------------------------------------------- transforms


def _mapping(target: str) -> Callable[[Any, dict], Any]:
    """A transform for a TRL key whose value is a mapping: set as one value of ``target`` (a plain mapping is
    read as ``{slimgrpo_key: value}``); None or empty changes nothing."""
    def transform(value, trl):
        return {target: dict(value)} if value else SKIP
    return transform


def _get(trl: dict, key: str) -> Any:
    value = trl.get(key)
    return TRL_DEFAULTS[key] if value is None else value


def _batch(value, trl):
    """slimgrpo's run.batch_size is the generated batch: TRL's per_device_train_batch_size x
    gradient_accumulation_steps (one optimizer step), or x steps_per_generation where that is set (TRL then
    generates that many micro-batches at once and takes steps_per_generation / gradient_accumulation_steps
    optimizer steps from them: ``_steps_per_generation``)."""
    per_device = int(_get(trl, "per_device_train_batch_size"))
    spg = trl.get("steps_per_generation")
    per_generation = int(spg) if spg is not None else int(_get(trl, "gradient_accumulation_steps"))
    return {"memory.micro_batch_size": per_device, "run.batch_size": per_device * per_generation}


def _steps_per_generation(value, trl):
    """TRL's steps_per_generation counts micro-batches of per_device_train_batch_size; slimgrpo's counts the
    optimizer steps one generated batch is split into: TRL's / gradient_accumulation_steps."""
    if value is None:
        return SKIP
    accumulation = int(_get(trl, "gradient_accumulation_steps"))
    if int(value) % accumulation:
        raise Refused(f"steps_per_generation={value} is not a multiple of gradient_accumulation_steps="
                      f"{accumulation}: TRL would end a generated batch inside an optimizer step")
    return int(value) // accumulation


def _max_steps(value, trl):
    if trl.get("total_episodes") is not None:
        return SKIP  # PPO: total_episodes decides the run's length (TRL 1.12's PPO never reads max_steps)
    if value is None or int(value) <= 0:
        return SKIP  # -1: derived from num_train_epochs
    return -(-int(value) // optimizer_steps_per_generation(trl))


def optimizer_steps_per_generation(trl: dict) -> int:
    """TRL's optimizer steps from one generated batch: num_iterations x steps_per_generation /
    gradient_accumulation_steps (1 with TRL's defaults). slimgrpo counts its steps in generated batches."""
    spg = trl.get("steps_per_generation")
    slices = int(spg) // int(_get(trl, "gradient_accumulation_steps")) if spg is not None else 1
    return max(1, slices) * int(trl.get("num_iterations") or 1)


def _epochs(value, trl):
    if trl.get("total_episodes") is not None:
        return SKIP
    return SKIP if int(_get(trl, "max_steps")) > 0 else float(value)  # max_steps > 0 wins, as in transformers


def _total_episodes(value, trl):
    """TRL 1.12's PPO: episodes are completions (one per prompt), so ``ceil(total_episodes / run.batch_size)``
    rollouts, ``run.batch_size`` as ``_batch`` sets it; None: ``num_train_epochs`` passes over the prompts."""
    if value is None:
        return SKIP
    batch = int(_get(trl, "per_device_train_batch_size")) * int(_get(trl, "gradient_accumulation_steps"))
    return {"run.max_steps": max(1, -(-int(value) // batch))}


def _stop_token(value, trl):
    if value not in (None, "eos"):
        raise Refused(f"stop_token={value!r}: TRL allows 'eos' and None")
    if value is None and trl.get("stop_token_id") is None:
        return SKIP  # TRL samples response_length tokens past an EOS; slimgrpo ends at the EOS (table note)
    if value == "eos" and trl.get("stop_token_id") is not None:
        raise Refused("stop_token and stop_token_id are both set; TRL refuses that too")
    return SKIP


def _dtype(value, trl):
    text = str(value).removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    text = aliases.get(text, text)
    if text not in ("auto", "float32", "bfloat16", "float16"):
        raise Refused(f"dtype {value!r}: slimgrpo loads weights as auto, float32, bfloat16 or float16")
    return text


def _precision(dtype: str):
    def transform(value, trl):
        if value and dtype == "float16" and not trl.get("use_peft"):
            # TRL's fp16 is autocast over float32 weights with a gradient scaler; slimgrpo trains the weights
            # in their own dtype, with no float32 master copy of float16 ones, so float16 full fine-tuning is
            # refused (config/precision.py)
            raise Refused("fp16=true with full fine-tuning: TRL keeps float32 weights and scales the loss; "
                          "slimgrpo keeps no float32 master copy of float16 weights and would step them directly. "
                          "Use bf16: true (bfloat16 weights with float32 master weights) or neither (float32); "
                          "fp16 with use_peft: true maps to model.dtype=float16 (the adapters train in float32, "
                          "the loss scaled dynamically)")
        return dtype if value else SKIP
    return transform


def _scheduler(value, trl):
    value = {"constant_with_warmup": "constant"}.get(value, value)
    if value not in ("constant", "cosine", "linear"):
        raise Refused(f"lr_scheduler_type={value!r}: slimgrpo has constant, cosine and linear (each after warmup)")
    return value


def _optimizer(value, trl):
    if value in ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"):
        return "adamw"
    if value in ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "adamw_torch_8bit"):
        return "adamw_8bit"
    raise Refused(f"optim={value!r}: slimgrpo has adamw and adamw_8bit (memory.optimizer)")


def _scale_rewards(value, trl):
    if value is True:
        return "group"
    if value is False:
        return "none"
    return value


def _save_strategy(value, trl):
    if value == "no":
        return {"run.save_checkpoints": False}
    if value == "steps":
        return SKIP
    raise Refused(f"save_strategy={value!r}: slimgrpo saves every run.save_steps steps (or only at the end)")


def _save_steps(value, trl):
    if isinstance(value, float) and value < 1:
        raise Refused("save_steps below 1 (a ratio): give a number of steps")
    return int(value)


def _save_total_limit(value, trl):
    return SKIP if value is None else int(value)


def _eval_strategy(value, trl):
    if value in ("no", None):
        return SKIP
    if value == "steps":
        return {"eval.steps": int(trl.get("eval_steps") or _get(trl, "logging_steps"))}
    raise Refused(f"eval_strategy={value!r}: slimgrpo evaluates every eval.steps steps")


def _eval_steps(value, trl):
    return SKIP if trl.get("eval_strategy", "no") == "no" else int(value)


def _best_metric(value, trl):
    """TRL's ``metric_for_best_model`` names an eval metric with or without its ``eval_`` prefix."""
    if value is None:
        return SKIP  # TRL: the eval loss; slimgrpo keeps its default, eval/accuracy_greedy
    name = str(value)
    if name.startswith("eval/"):
        return name  # already slimgrpo's
    name = name.removeprefix("eval_")
    if name == "reward":
        return "eval/mean_reward"
    if name.startswith("rewards/") and name.endswith("/mean"):
        return f"eval/rewards/{name[len('rewards/'):-len('/mean')]}"
    if name in ("accuracy_greedy", "accuracy_sampled", "mean_reward") or name.startswith("pass@"):
        return f"eval/{name}"
    raise Refused(f"metric_for_best_model={value!r}: slimgrpo's evaluation reports eval/accuracy_greedy, "
                  "eval/accuracy_sampled, eval/pass@<k>, eval/mean_reward (TRL's eval_reward) and "
                  "eval/rewards/<fn> (TRL's eval_rewards/<fn>/mean); it has no eval loss")


def _greater_is_better(value, trl):
    return SKIP if value is None else bool(value)


def _min_p(value, trl):
    return 0.0 if value is None else float(value)


def _lora_targets(value, trl):
    return SKIP if value is None else value


def _resume(value, trl):
    if value in (None, False):
        return {"run.resume": "never"}  # TRL starts fresh unless told to resume
    return "auto" if value is True else str(value)


def _use_cpu(value, trl):
    return "cpu" if value else SKIP


def _use_vllm(value, trl):
    return "vllm" if value else SKIP


def _vllm_mode(value, trl):
    if value == "server" and trl.get("use_vllm"):
        raise Refused("slimgrpo runs vLLM colocated in the training process (vllm_mode: colocate, TRL 1.16's "
                      "default, with rollout.engine=vllm); a separate `trl vllm-serve` server is not supported")
    return SKIP


def _is_clip_max(value, trl):
    """TRL's ``vllm_importance_sampling_clip_max``; the deprecated ``vllm_importance_sampling_cap`` wins over it."""
    return SKIP if trl.get("vllm_importance_sampling_cap") is not None else value


def _sampler_cap(value, trl):
    return SKIP if value is None else value


def _fsdp(value, trl):
    return "fsdp" if value else SKIP


def _backend(value, trl):
    if value is None:
        return SKIP
    if value in ("nccl", "gloo"):
        return value
    raise Refused(f"ddp_backend={value!r}: slimgrpo uses nccl or gloo (distributed.backend)")


def _log_completions(value, trl):
    return int(_get(trl, "logging_steps")) if value else 0


def _sampling_order(value, trl):
    if value == "random":
        return True
    if value == "sequential":
        return False
    raise Refused(f"train_sampling_strategy={value!r}: slimgrpo shuffles (random) or not (sequential)")


def _reward_list(value, trl):
    """``reward_model_name_or_path`` first, then ``reward_funcs``, as ``trl grpo`` orders them."""
    specs = []
    if trl.get("reward_model_name_or_path"):
        specs.append(str(trl["reward_model_name_or_path"]))
    funcs = trl.get("reward_funcs") or []
    for name in [funcs] if isinstance(funcs, str) else funcs:
        specs.append(_reward_spec(str(name), trl.get("__base_dir__", ".")))
    return specs


TRL_BUILTIN_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward",
                       "get_soft_overlong_punishment")


def _reward_spec(name: str, base_dir: str) -> str:
    """A ``trl grpo`` reward name as a slimgrpo spec: TRL's registry, or ``module.function``."""
    if name == "get_soft_overlong_punishment":
        return "slimgrpo.trl.rewards:soft_overlong_punishment_reward"  # TRL's CLI values (1280, 256)
    if name in TRL_BUILTIN_REWARDS:
        return f"trl.rewards:{name}"
    if "." not in name:
        raise Refused(f"reward_funcs: {name!r} is neither one of TRL's {list(TRL_BUILTIN_REWARDS)} nor a dotted "
                      "import path (module.function)")
    module, function = name.rsplit(".", 1)
    file = module.replace(".", os.sep) + ".py"
    for folder in (base_dir, os.getcwd()):  # trl grpo imports from the working directory
        if os.path.isfile(os.path.join(folder, file)):
            return f"{os.path.join(folder, file)}:{function}"
    return f"{module}:{function}"


def _model_init_kwargs(value, trl):
    if not value:
        return SKIP
    known = {"dtype": "model.dtype", "torch_dtype": "model.dtype", "attn_implementation": "model.attn_implementation",
             "trust_remote_code": "model.trust_remote_code"}
    out = {}
    for k, v in dict(value).items():
        if k == "revision" and v in (None, "main"):
            continue
        if k not in known:
            raise Refused(f"model_init_kwargs.{k}: slimgrpo reads dtype, attn_implementation and trust_remote_code")
        out[known[k]] = _dtype(v, trl) if known[k] == "model.dtype" else v
    return out


def _quant_type(value, trl):
    if value != "nf4":
        raise Refused("slimgrpo's 4-bit base is NF4 only")
    return SKIP


def _max_prompt_length(value, trl):
    return SKIP if value is None else int(value)


def _generation_batch_size(value, trl):
    if value is None:
        return SKIP
    expected = int(_get(trl, "per_device_train_batch_size")) * int(_get(trl, "gradient_accumulation_steps"))
    if int(value) != expected and trl.get("steps_per_generation") is None:
        raise Refused(f"generation_batch_size={value} differs from per_device_train_batch_size x "
                      f"gradient_accumulation_steps = {expected}: use steps_per_generation instead")
    return SKIP
