"""``GRPOTrainer``: TRL 1.16's trainer class, as a script calls it, training with slimgrpo.

    from slimgrpo.trl import GRPOConfig, GRPOTrainer          # was: from trl import GRPOConfig, GRPOTrainer
    trainer = GRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=[accuracy], args=GRPOConfig(...),
                          train_dataset=dataset)
    trainer.train()
    trainer.save_model(trainer.args.output_dir)

What a script gives becomes one slimgrpo run: ``args`` through the rules table (``config/trl_table.py``, the one
``slimgrpo train --trl-config`` follows, so the script and the YAML are the same run), ``model`` as a name or
folder (``model.path``) or as a loaded model (a ``PreTrainedModel``, or a ``PeftModel`` whose adapters are the
ones trained), ``reward_funcs`` as callables, reward-model folders or loaded reward models, ``peft_config`` as
``lora.*``, the datasets as they are. The run is read, admitted against its memory plan and built when the
trainer is made (``train/trainer.py``'s ``prepare_run``), so ``trainer.model`` is the live policy from then on.
What TRL does that slimgrpo does not is refused where the script asks for it, naming it (the rules table, a
custom optimizer, the hub).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

from slimgrpo.causal_lm import is_peft, unwrap_causal_lm
from slimgrpo.config import ConfigError, from_dict, validate_config
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs
from slimgrpo.train.loop import TrainLoop
from slimgrpo.train.trainer import prepare_run
from slimgrpo.trl.callbacks import TrainerEvents
from slimgrpo.trl.common import TrlTrainer
from slimgrpo.trl.configs import GRPOConfig, given_fields
from slimgrpo.trl.evaluation import eval_sets, evaluators_for, streamed_train_rows, union_rows
from slimgrpo.trl.yaml import convert, fit_prompt_length, model_type_of, nest, peft_default_targets

__all__ = ["GRPOTrainer"]

log = logging.getLogger("slimgrpo.trl")

class GRPOTrainer(TrlTrainer):
    """TRL 1.16's ``GRPOTrainer`` (module docstring). Arguments as TRL's; the ones slimgrpo cannot honour are
    refused with the reason (``optimizers`` other than ``(None, None)``: slimgrpo builds its own AdamW from
    ``args``)."""

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 reward_processing_classes: Any = None, callbacks: list | None = None, optimizers: tuple = (None, None),
                 peft_config: Any = None, tools: list[Callable] | None = None, environment_factory: Any = None,
                 rollout_func: Callable | None = None):
        if args is None:
            name = model if isinstance(model, str) else unwrap_causal_lm(model).config._name_or_path
            args = GRPOConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-GRPO")
        if tuple(optimizers) != (None, None):
            raise ValueError("GRPOTrainer(optimizers=...): slimgrpo builds its optimizer and schedule from args "
                             "(optim, learning_rate, lr_scheduler_type, warmup_*); leave optimizers=(None, None)")
        if train_dataset is None and rollout_func is None:
            train_dataset = environment_owned_data(args, environment_factory)
        elif environment_factory is not None:
            train_dataset = with_empty_prompts(train_dataset)
        self.args = args
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else \
            [] if reward_funcs is None else [reward_funcs]
        if not self.reward_funcs and environment_factory is None:
            raise ValueError("No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose "
                             "environment defines a `get_reward` method.")
        self.eval_dataset, self.tools, self.rollout_func = eval_dataset, tools, rollout_func
        train_dataset = streamed_train_rows(train_dataset, args)
        named_sets = eval_sets(eval_dataset)
        cfg = run_config(args, model, self.reward_funcs, peft_config, reward_processing_classes,
                         (train_dataset, union_rows(named_sets) if named_sets else None),
                         environment_factory is not None, bool(tools) or environment_factory is not None)
        self._reward_attributes(cfg.rewards.functions, reward_processing_classes)
        policy = None
        if not isinstance(model, (str, os.PathLike)):
            from slimgrpo.modeling import load_run_tokenizer, policy_of

            policy = policy_of(model, processing_class or load_run_tokenizer(cfg), cfg)
        parts = prepare_run(cfg, RunInputs(from_environment(), policy, train_dataset, tools, environment_factory,
                                           rollout_func, tokenizer=processing_class))
        from transformers import DefaultFlowCallback, TrainerControl
        from transformers.trainer_callback import CallbackHandler

        self.state = parts.trainer_state  # what reward functions receive as trainer_state, as in TRL
        # transformers' default flow first, as its Trainer has it (slimgrpo's own progress replaces the bar)
        self.callback_handler = CallbackHandler([DefaultFlowCallback, *(callbacks or [])], parts.policy.model,
                                                parts.policy.tokenizer, parts.optimizer, parts.scheduler)
        self._events = TrainerEvents(self.callback_handler, args, self.state, TrainerControl(),
                                     _logging_steps(args, cfg))
        self._loop = TrainLoop(parts, events=[self._events])
        self._agent = parts.agent  # tools / environments: evaluate() rolls out as training does
        if named_sets and None not in named_sets:  # TRL's named sets: each evaluated apart, eval_<name>_...
            self._loop.evaluator = evaluators_for(self._loop, self._agent, named_sets)
        self.model = parts.policy.model
        self.processing_class = parts.policy.tokenizer
        self.aux_loss_enabled = False  # TRL's flag for an MoE router's load-balancing loss: slimgrpo never adds it
        self._run_attributes(parts)

    def _run_attributes(self, parts) -> None:
        """What TRL's trainer exposes of the run it built: ``reward_func_names`` and ``reward_weights`` (a tensor)
        of every reward, an environment's ``get_reward`` after the script's functions (weight 1, no processing
        class), and ``tools``: the script's tools, then the environments' methods."""
        import torch

        from slimgrpo.agent.rollout import AgentRollout

        runner = parts.reward_runner
        self.reward_func_names = list(runner.names)
        self.reward_funcs = self.reward_funcs + [fn for _, fn in runner.functions[len(self.reward_funcs):]]
        self.reward_processing_classes += [None] * (len(self.reward_funcs) - len(self.reward_processing_classes))
        self.reward_weights = torch.tensor(runner.weights, dtype=torch.float32)
        if isinstance(parts.agent, AgentRollout):
            self.tools = parts.agent.toolbox.offered_tools()

    def _reward_attributes(self, resolved: list, processing_classes: Any) -> None:
        """``reward_funcs`` and ``reward_processing_classes`` as TRL's trainer holds them: a reward model as the
        loaded ``PreTrainedModel`` with its tokenizer beside it."""
        from slimgrpo.rewards.reward_model import RewardModel

        classes = reward_processing_classes_of(processing_classes, len(resolved))
        self.reward_funcs = [fn.model if isinstance(fn, RewardModel) else given
                             for fn, given in zip(resolved, self.reward_funcs)]
        self.reward_processing_classes = [fn.tokenizer if isinstance(fn, RewardModel) else tok
                                          for fn, tok in zip(resolved, classes)]

    # ------------------------------------------------------------------ what scripts call

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs) -> Any:
        """Train; ``resume_from_checkpoint`` as TRL takes it: True, the newest checkpoint of ``output_dir``
        (an error when there is none), or a checkpoint folder. Returns transformers' ``TrainOutput``.

        The trainer already went on from the newest complete checkpoint of ``output_dir`` when it was made
        (slimgrpo's ``run.resume=auto``: a rerun continues a stopped run); a folder named here is loaded over it."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments {sorted(kwargs)}")
        if resume_from_checkpoint:
            self._resume(resume_from_checkpoint)
        from transformers.trainer_utils import TrainOutput

        summary = self._loop.train()
        last = self.state.log_history[-1] if self.state.log_history else {}
        return TrainOutput(self.state.global_step, last.get("train_loss", summary.get("loss")), last)

    def _resume(self, checkpoint: str | bool) -> None:
        checkpoints = self._loop.checkpoints
        resumed = checkpoints.plan.resume_from
        if checkpoint is True:
            if resumed is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir}): "
                                 "train(resume_from_checkpoint=True) needs one")
            return  # the build went on from it
        path = Path(checkpoint).resolve()
        if resumed is not None and Path(resumed).resolve() == path:
            return
        self._loop.step_idx = checkpoints.resume_from(path)

    @property
    def entropy_coef(self) -> float:
        """TRL's attribute: the entropy bonus's coefficient now, after the adaptive controller's updates
        (``use_adaptive_entropy``), else ``args.entropy_coef``."""
        return self._loop.updater.entropy_control.coef

    def get_high_entropy_mask(self, entropies: Any, mask: Any, threshold: float) -> Any:
        """TRL's helper: the tokens of ``mask`` whose entropy is at or above the ``threshold`` quantile of the
        masked tokens' entropies (``top_entropy_quantile = 1 - threshold`` keeps the top share), as bools; none
        when nothing is masked in. The loss uses the same functions (``loss/policy_losses.py``)."""
        from slimgrpo.loss.policy_losses import entropy_threshold, high_entropy_mask

        return high_entropy_mask(entropies, mask, entropy_threshold(entropies, mask, 1.0 - threshold))

    @staticmethod
    def get_off_policy_mask(advantages: Any, per_token_logps: Any, sampling_per_token_logps: Any, mask: Any,
                            off_policy_threshold: float) -> Any:
        """TRL's helper (DeepSeek-V3.2's off-policy sequence mask, ``off_policy_mask_threshold``): 1 for a
        sequence kept, 0 for one dropped (negative advantage and a mean KL from the sampling policy above the
        threshold), shaped ``[sequences, 1]`` in the log-probs' dtype. The loss uses the same function."""
        from slimgrpo.loss.policy_losses import off_policy_keep

        keep = off_policy_keep(per_token_logps, sampling_per_token_logps, mask, advantages.reshape(-1),
                               off_policy_threshold)
        return keep.to(per_token_logps.dtype).unsqueeze(-1)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
                 ) -> dict[str, float]:
        """Run the evaluation on ``eval_dataset`` (a set, a dict of named sets, or None: the trainer's own):
        its metrics with ``metric_key_prefix`` (``eval_<name>_...`` for named sets, as TRL's), logged and said to
        the callbacks' ``on_evaluate``. slimgrpo's evaluation has no loss (``trl/evaluation.py``)."""
        if eval_dataset is not None:
            evaluator = evaluators_for(self._loop, self._agent, eval_sets(eval_dataset))
        else:
            evaluator = self._loop.evaluator
        if evaluator is None:
            raise ValueError("evaluate() needs an evaluation set: GRPOTrainer(eval_dataset=...) or "
                             "evaluate(eval_dataset=...)")
        metrics = evaluator.run()
        logs = {f"{metric_key_prefix}_" + k.removeprefix("eval/").replace("/", "_"): v for k, v in metrics.items()}
        self._events.log(logs)
        self._events.control = self.callback_handler.on_evaluate(self.args, self.state, self._events.control,
                                                                 metrics=logs)
        return logs

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The policy (a peft model: its adapters) and the tokenizer into ``output_dir`` (default
        ``args.output_dir``), as safetensors."""
        folder = Path(output_dir or self.args.output_dir or "trainer_output")
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder), safe_serialization=True)
        self.processing_class.save_pretrained(str(folder))


def environment_owned_data(args: GRPOConfig, environment_factory: Any) -> list[dict[str, Any]]:
    """TRL 1.16's training set when the script gives none: an environment that owns the data (its ``reset()``
    returns the prompt, appended to an empty user message) with ``max_steps`` setting the length: one generated
    batch's prompts, empty, cycled. Refused, with TRL's messages, without an environment, with several (a dict:
    rows must name theirs in an ``environment`` column) or without ``max_steps``."""
    if environment_factory is None:
        raise ValueError("`train_dataset` is required unless an `environment_factory` is provided.")
    if isinstance(environment_factory, dict):
        raise ValueError("A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
                         "`environment` column to route each example to its environment. Provide a dataset, or "
                         "pass a single environment factory.")
    if args.max_steps <= 0:
        raise ValueError("When training without a `train_dataset` (the environment owns the data and returns the "
                         "prompt from `reset()`), `max_steps` must be set to a positive value to define the training "
                         "length. Set it via `GRPOConfig(max_steps=...)`.")
    rows = max(1, args.generation_batch_size // args.num_generations)
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(rows)]


def with_empty_prompts(data: Any) -> Any:
    """Rows without a ``prompt`` column when an environment owns the data (its ``reset()`` gives the prompt; TRL
    1.16's rows may only route to an environment): each gets an empty user message to append it to."""
    from datasets import Dataset

    empty = [{"role": "user", "content": ""}]
    if isinstance(data, Dataset) and "prompt" not in data.column_names:
        return data.add_column("prompt", [empty] * len(data))
    if isinstance(data, list) and data and all(isinstance(r, dict) and "prompt" not in r for r in data):
        return [{**r, "prompt": empty} for r in data]
    return data


def _logging_steps(args, cfg) -> int:
    """How often ``on_log`` runs: TRL's ``logging_strategy`` and ``logging_steps`` (a fraction of the run's
    steps where below 1); 0 with ``no``; ``epoch``: the steps of one pass over the prompts."""
    strategy = str(args.logging_strategy).removeprefix("IntervalStrategy.").lower()
    if strategy == "no":
        return 0
    if strategy == "epoch":
        return max(1, cfg.run.max_steps // max(1, int(cfg.run.num_train_epochs or 1)))
    steps = float(args.logging_steps)
    return max(1, int(steps * cfg.run.max_steps) if steps < 1 else int(steps))


def run_config(args: GRPOConfig, model: Any, reward_funcs: list, peft_config: Any = None,
               reward_processing_classes: Any = None, datasets: tuple = (None, None),
               environment_given: bool = False, tools_given: bool = False):
    """The slimgrpo ``Config`` of a script's trainer: ``args``'s set fields through the rules table (what
    ``--trl-config`` does with a YAML), the model, LoRA from ``peft_config`` or a peft model's own adapters, the
    reward functions (a reward model with its tokenizer from ``reward_processing_classes``) and the datasets
    (``(train_dataset, eval_dataset)``, either None); ``environment_given``: an ``environment_factory`` was given
    (its ``get_reward`` may be the reward); ``tools_given``: tools or an environment (prompts carry their
    schemas: ``fit_prompt_length``)."""
    values = convert(given_fields(args), os.getcwd()).values
    if isinstance(model, (str, os.PathLike)):
        values["model.path"] = os.path.abspath(os.fspath(model)) if os.path.exists(model) else os.fspath(model)
    else:
        values["model.path"] = unwrap_causal_lm(model).config._name_or_path or ""
        if is_peft(model):
            values.update(lora_values(model.peft_config[model.active_adapter]))
    if peft_config is not None:
        if not isinstance(model, (str, os.PathLike)) and is_peft(model):
            raise ValueError("GRPOTrainer(peft_config=...) with a model that carries LoRA adapters already: "
                             "give one or the other")
        values.update(lora_values(peft_config, model))
    cfg = from_dict(nest(values), base_dir=os.getcwd())
    if "max_prompt_length" not in given_fields(args):  # as --trl-config: TRL 1.16 does not cut prompts
        fit_prompt_length(cfg, log.info, tools=tools_given)
    cfg.rewards.functions = _rewards(reward_funcs, reward_processing_classes, cfg.run.device,
                                     bool(args.trust_remote_code))
    train_dataset, eval_dataset = datasets
    if train_dataset is not None:
        cfg.data.path = train_dataset
    if eval_dataset is not None:
        cfg.eval.data = eval_dataset
    try:
        validate_config(cfg, environment_given)
    except ConfigError as e:
        raise ValueError(f"GRPOTrainer: {e}") from None
    return cfg


def lora_values(peft_config: Any, model: Any = None) -> dict[str, Any]:
    """``lora.*`` of a peft ``LoraConfig``; what slimgrpo does not train (DoRA, rsLoRA, modules to save, LoRA on
    parameters) is refused, naming it. ``target_modules=None`` is peft's choice for ``model``'s architecture (a
    loaded model or a folder), as peft makes it; all-linear where that cannot be read."""
    refused = [("use_dora", False), ("use_rslora", False), ("modules_to_save", None),
               ("target_parameters", None)]
    for name, fine in refused:
        value = getattr(peft_config, name, fine)
        if value not in (fine, [], ()):
            raise ValueError(f"peft_config.{name}={value!r}: slimgrpo trains plain LoRA adapters only")
    targets = peft_config.target_modules
    if targets is None:
        targets = peft_default_targets(model_type_of(model)) if model is not None else None
        if targets is None:
            log.warning("peft_config.target_modules=None: peft's default modules for this model could not be read; "
                        "LoRA goes on all linear layers (lora.target_modules=all-linear)")
            targets = "all-linear"
    elif not isinstance(targets, str):
        targets = sorted(targets)
    return {"lora.enabled": True, "lora.r": int(peft_config.r), "lora.alpha": float(peft_config.lora_alpha),
            "lora.dropout": float(peft_config.lora_dropout), "lora.target_modules": targets}


def _rewards(reward_funcs: list, processing_classes: Any, device: str, trust_remote_code: bool = False) -> list:
    """TRL's ``reward_funcs`` as slimgrpo's loader takes them (callables, reward-model folders or loaded reward
    models: ``rewards/loading.py``). As TRL's trainer: a string that is no slimgrpo spec (``file.py:function``, a
    built-in name) is a reward model's name or folder, loaded with ``AutoModelForSequenceClassification``
    (``num_labels=1``; a hub name from the local cache, or the hub when online); ``reward_processing_classes`` is
    one tokenizer per function (a single one for a single function), that of a reward model read with it."""
    from slimgrpo.rewards.reward_model import RewardModel

    tokenizers = reward_processing_classes_of(processing_classes, len(reward_funcs))
    out = []
    for fn, tok in zip(reward_funcs, tokenizers):
        if _is_model_name(fn):
            from transformers import AutoModelForSequenceClassification

            fn = AutoModelForSequenceClassification.from_pretrained(os.fspath(fn), num_labels=1,
                                                                    trust_remote_code=trust_remote_code)
        out.append(RewardModel(fn, tokenizer=tok, device=device, trust_remote_code=trust_remote_code)
                   if _is_model(fn) else fn)
    return out


def reward_processing_classes_of(processing_classes: Any, count: int) -> list:
    """TRL's ``reward_processing_classes`` as a list of ``count`` entries (None: one None each; a single
    tokenizer: a list of it), refused where the lengths differ, with TRL's message."""
    if processing_classes is None:
        return [None] * count
    classes = list(processing_classes) if isinstance(processing_classes, (list, tuple)) else [processing_classes]
    if len(classes) != count:
        raise ValueError(f"The number of reward processing classes ({len(classes)}) must match the number of "
                         f"reward functions ({count}).")
    return classes


def _is_model_name(spec: Any) -> bool:
    """A string TRL would load as a reward model that slimgrpo's loader would not: no ``:`` (not
    ``file.py:function``), no built-in reward's name, not a local folder (the loader reads those itself)."""
    from slimgrpo.rewards.builtin import BUILTIN_REWARDS

    if not isinstance(spec, (str, os.PathLike)):
        return False
    spec = os.fspath(spec).strip()
    return bool(spec) and ":" not in spec and spec not in BUILTIN_REWARDS and not os.path.exists(spec) \
        and not spec.endswith(".py")


def _is_model(spec: Any) -> bool:
    """A ``torch.nn.Module`` (a reward model TRL's script loaded) or a folder holding one."""
    import torch

    from slimgrpo.rewards.reward_model import is_model_folder

    return isinstance(spec, torch.nn.Module) or (isinstance(spec, (str, os.PathLike)) and is_model_folder(spec))

