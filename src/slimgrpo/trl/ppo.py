"""``PPOTrainer``: TRL 1.12's PPO trainer (``trl.experimental.ppo``; TRL 1.16 has none) as TRL's
``examples/scripts/ppo/ppo.py`` calls it, training with slimgrpo's PPO in one copy of the weights (docs/ppo.md).

    from slimgrpo.trl import PPOConfig, PPOTrainer    # was: from trl.experimental.ppo import PPOConfig, PPOTrainer
    trainer = PPOTrainer(args=training_args, processing_class=tokenizer, model=policy, ref_model=ref_policy,
                         reward_model=reward_model, value_model=value_model, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, peft_config=peft_config)
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.generate_completions()

What the script gives becomes one slimgrpo run with ``loss.advantage_estimator=gae`` and one completion per
prompt, read, admitted and built when the trainer is made (``train/trainer.py``'s ``prepare_run``), as
``GRPOTrainer`` does:

- ``args``: PPOConfig's own fields at their values, set or not (a PPO run is TRL's PPO: 4 epochs over each
  rollout, 53-token responses, temperature 0.7, learning rate 3e-6 unless the script says otherwise), and
  the other fields the script set, through the rules table (``config/trl_table.py``); a field slimgrpo
  cannot honour is refused, naming it;
- ``model``: the policy, trained in place; ``peft_config`` adds LoRA adapters to it (``lora.*``);
- ``value_model`` (a sequence-classification model): with full fine-tuning the critic, its decoder and score
  head trained in place (a second model, as in TRL); with LoRA the critic is a second adapter on the policy's
  base with a zero value head, and ``value_model`` is not used (one copy of the weights); None with full
  fine-tuning: slimgrpo's own critic (``critic.model_path``'s default, the policy's weights);
- ``ref_model``: None, or a model holding the policy's initial weights (checked): slimgrpo's reference is the
  policy's base with its adapters off (LoRA) or its own copy of the initial weights (full fine-tuning);
- ``reward_model`` (a sequence-classification model): scored as TRL's PPO scores, on token ids
  (``PPOScore``), ``missing_eos_penalty`` included;
- ``train_dataset`` / ``eval_dataset``: rows of ``input_ids`` (ppo.py's pre-tokenized prompts, used as they
  are) or of ``prompt`` text (tokenized here as ppo.py's ``prepare_dataset`` does); ``eval_dataset`` feeds
  ``generate_completions()`` (and slimgrpo's evaluation where ``eval_strategy`` asks for it);
- each step's ``log_history`` entry carries TRL PPO's metric names where slimgrpo has the figure
  (``ppo_metrics``) next to slimgrpo's own.

What TRL does that slimgrpo does not is refused where the script asks for it (a custom optimizer or data
collator, named adapters, the k3 KL estimator, the hub).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from slimgrpo.causal_lm import is_peft, unwrap_causal_lm
from slimgrpo.config import Config, ConfigError, from_dict, validate_config
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs
from slimgrpo.train.loop import TrainLoop
from slimgrpo.train.trainer import prepare_run
from slimgrpo.trl.callbacks import TrainerEvents
from slimgrpo.trl.configs import PPOConfig, check_fields, given_fields
from slimgrpo.trl.common import TrlTrainer
from slimgrpo.trl.grpo import lora_values
from slimgrpo.trl.yaml import convert, nest

__all__ = ["PPOScore", "PPOTrainer", "ppo_metrics", "ppo_run_config", "token_rows"]

log = logging.getLogger("slimgrpo.trl")

PROMPT_IDS = "input_ids"  # the column of ppo.py's pre-tokenized prompts
# PPOConfig's fields that make a PPO run, handed to the rules table at their values whether the script set them
# or not: TRL's PPO defaults, not slimgrpo's GRPO ones (docs/ppo.md, "From TRL's ppo.py").
RUN_FIELDS = ("learning_rate", "num_ppo_epochs", "num_mini_batches", "cliprange", "kl_coef", "kl_estimator",
              "vf_coef", "cliprange_value", "gamma", "lam", "whiten_rewards", "response_length", "temperature",
              "local_rollout_forward_batch_size", "total_episodes", "stop_token", "stop_token_id",
              "missing_eos_penalty")
SHOWN_ROWS = 5  # generate_completions' table, as TRL prints it


class PPOTrainer(TrlTrainer):
    """TRL 1.12's ``PPOTrainer`` (module docstring): its constructor and methods; what slimgrpo cannot honour
    is refused with the reason."""

    def __init__(self, args: PPOConfig, processing_class: Any, model: Any, ref_model: Any, reward_model: Any,
                 train_dataset: Any, value_model: Any, data_collator: Any = None, eval_dataset: Any = None,
                 optimizers: tuple = (None, None), callbacks: list | None = None, peft_config: Any = None):
        _refuse_unsupported(args, data_collator, optimizers, processing_class)
        if train_dataset is None:
            raise ValueError("PPOTrainer needs train_dataset: rows of 'input_ids' (ppo.py's tokenized prompts)")
        if peft_config is not None and is_peft(model):
            raise ValueError("PPOTrainer(peft_config=...) with a model that carries LoRA adapters already: give "
                             "the base model and the peft_config, or the peft model alone")
        train_rows = token_rows(train_dataset, processing_class, "train_dataset")
        self._eval_rows = None if eval_dataset is None else token_rows(eval_dataset, processing_class,
                                                                        "eval_dataset")
        lora = peft_config is not None or is_peft(model)
        if ref_model is not None:
            check_reference(ref_model, model)
        if lora and value_model is not None:
            log.warning("PPOTrainer with LoRA: the critic is a second adapter on the policy's base with a value "
                        "head (one copy of the weights); value_model is not used (docs/ppo.md)")
        self.args, self.processing_class = args, processing_class
        self.reward_model, self.value_model = reward_model, value_model
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        cfg = ppo_run_config(args, model, peft_config, (train_rows, self._eval_rows), None if lora else value_model)
        from slimgrpo.modeling import policy_of, resolve_device

        self._score = PPOScore(reward_model, processing_class.eos_token_id, args.missing_eos_penalty,
                               resolve_device(cfg.run.device))
        cfg.rewards.functions = [self._score]
        try:
            validate_config(cfg)
        except ConfigError as e:
            raise ValueError(f"PPOTrainer: {e}") from None
        if args.stop_token_id is not None:  # TRL's way: the policy's generation config names the stop token
            unwrap_causal_lm(model).generation_config.eos_token_id = args.stop_token_id
        tokenizer = run_tokenizer(processing_class, model)
        policy = policy_of(model, tokenizer, cfg)
        parts = prepare_run(cfg, RunInputs(from_environment(), policy, tokenizer=tokenizer))
        from transformers import DefaultFlowCallback, TrainerControl
        from transformers.trainer_callback import CallbackHandler

        self.state = parts.trainer_state
        self.callback_handler = CallbackHandler([DefaultFlowCallback, *(callbacks or [])], parts.policy.model,
                                                processing_class, parts.optimizer, parts.scheduler)
        self._events = PPOEvents(self.callback_handler, args, self.state, TrainerControl(), cfg.loss.kl_coef)
        self._loop = TrainLoop(parts, events=[self._events])
        # TRL's model wraps policy and value model; here it is the policy (the critic is the run's: the value_model
        # object with full fine-tuning, an adapter on the policy's base with LoRA)
        self.model = self.policy_model = parts.policy.model

    # ------------------------------------------------------------------ what scripts call

    def train(self) -> Any:
        """Train every rollout the run has (``total_episodes``, else ``num_train_epochs`` passes); returns
        transformers' ``TrainOutput`` (TRL's PPO returns nothing)."""
        from transformers.trainer_utils import TrainOutput

        summary = self._loop.train()
        last = self.state.log_history[-1] if self.state.log_history else {}
        return TrainOutput(self.state.global_step, last.get("train_loss", summary.get("loss")), last)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The policy (a peft model: its adapters) and the script's tokenizer into ``output_dir`` (default
        ``args.output_dir``), as safetensors; the critic is not saved, as in TRL."""
        from slimgrpo.modeling import CRITIC_ADAPTER

        folder = Path(output_dir or self.args.output_dir or "trainer_output")
        folder.mkdir(parents=True, exist_ok=True)
        if is_peft(self.model):  # the policy's adapters, not the LoRA critic's
            policy = [name for name in self.model.peft_config if name != CRITIC_ADAPTER]
            self.model.save_pretrained(str(folder), safe_serialization=True, selected_adapters=policy)
        else:
            self.model.save_pretrained(str(folder), safe_serialization=True)
        self.processing_class.save_pretrained(str(folder))

    def generate_completions(self, sampling: bool = False) -> None:
        """Complete ``eval_dataset``'s prompts greedily (TRL samples at temperature 0.01) with the trained
        policy, score them with the reward model and print the first rows as a table (query, model response,
        score). ``sampling``: only the first ``per_device_eval_batch_size`` prompts, as TRL's in-training
        samples. Nothing without an ``eval_dataset``, as in TRL."""
        if self._eval_rows is None:
            return
        rows = self._eval_rows[: self.args.per_device_eval_batch_size] if sampling else self._eval_rows
        prompt_ids = [list(r[PROMPT_IDS]) for r in rows]
        params = dataclasses.replace(self._loop.sampling, temperature=0.0)
        rollout = self._loop.engine.generate(prompt_ids, 1, params)
        lengths = rollout.completion_lengths.tolist()
        completion_ids = [rollout.completion_ids[i, :n].tolist() for i, n in enumerate(lengths)]
        scores = self._score.scores(prompt_ids, completion_ids)
        if not self._loop.dist.is_main:
            return
        from rich.console import Console
        from rich.table import Table

        tok = self.processing_class
        table = Table(show_lines=True)
        for column in ("query", "model response", "score"):
            table.add_column(column)
        for ids, completion, score in list(zip(prompt_ids, completion_ids, scores))[:SHOWN_ROWS]:
            table.add_row(tok.decode(ids, skip_special_tokens=True), tok.decode(completion), f"{score:.4f}")
        Console().print(table)


# ---------------------------------------------------------------------------------------- the run's config


def ppo_run_config(args: PPOConfig, model: Any, peft_config: Any, rows: tuple, value_model: Any = None) -> Config:
    """The slimgrpo ``Config`` of a PPO script, not yet validated and without its reward (``PPOTrainer`` adds
    ``PPOScore``): ``args`` through the rules table (``RUN_FIELDS`` always, the others where set), PPO with one
    completion per prompt, the model, LoRA from ``peft_config`` or a peft model's adapters, the token rows
    (``(train, eval or None)``, from ``token_rows``) and, for full fine-tuning, ``value_model`` as the critic."""
    check_fields(args, "PPOConfig")  # the set fields: refused naming the first, the ignored ones said once
    trl = {**{k: getattr(args, k) for k in RUN_FIELDS}, **given_fields(args)}
    conversion = convert(trl, os.getcwd())
    if conversion.refused:
        row = conversion.refused[0]
        raise ValueError(f"PPOConfig({row.key}): slimgrpo cannot honour {row.detail}")
    values = conversion.values
    if args.total_episodes is not None:  # it decides the run's length (TRL's num_train_epochs default is unused)
        values.pop("run.num_train_epochs", None)
    train_rows, eval_rows = rows
    longest = max(len(r[PROMPT_IDS]) for r in [*train_rows, *(eval_rows or [])])
    values.update({"loss.advantage_estimator": "gae", "rollout.num_generations": 1,
                   "model.disable_dropout": True,  # TRL's PPO turns dropout off in every model
                   "data.prompt_column": PROMPT_IDS, "data.max_prompt_length": longest,  # TRL cuts no prompt
                   "rewards.timeout_s": None,  # the reward model is the trainer's scoring, not a user function
                   "model.path": unwrap_causal_lm(model).config._name_or_path or ""})
    if is_peft(model):
        values.update(lora_values(model.peft_config[model.active_adapter]))
    if peft_config is not None:
        values.update(lora_values(peft_config, model))
    cfg = from_dict(nest(values), base_dir=os.getcwd())
    cfg.data.path = train_rows
    if eval_rows is not None and cfg.eval.steps:  # eval_strategy="steps": slimgrpo's evaluation on eval_dataset
        cfg.eval.data = eval_rows
    if value_model is not None:  # full fine-tuning: the script's value model is the critic (update/critic.py)
        cfg.critic.model_path = value_model
    return cfg


def _refuse_unsupported(args: Any, data_collator: Any, optimizers: tuple, processing_class: Any) -> None:
    if not isinstance(args, PPOConfig):
        raise TypeError(f"PPOTrainer(args=...) takes slimgrpo.trl.PPOConfig, got {type(args).__name__}")
    if tuple(optimizers) != (None, None):
        raise ValueError("PPOTrainer(optimizers=...): slimgrpo builds one AdamW for policy and critic and its "
                         "schedule from args (learning_rate, lr_scheduler_type, warmup_*); leave "
                         "optimizers=(None, None)")
    if data_collator is not None:
        from transformers import DataCollatorWithPadding

        if not isinstance(data_collator, DataCollatorWithPadding):  # TRL's default: what slimgrpo does anyway
            raise ValueError("PPOTrainer(data_collator=...): slimgrpo pads the prompt ids itself; leave "
                             "data_collator=None")
    if processing_class is None or processing_class.eos_token_id is None:
        raise ValueError("PPOTrainer needs processing_class: the tokenizer the prompts were tokenized with, with "
                         "an eos_token (where completions end)")


def token_rows(dataset: Any, tokenizer: Any, name: str) -> list[dict[str, Any]]:
    """The rows of ``dataset`` (a ``datasets.Dataset`` or a list of row dicts) with their prompt as token ids in
    ``input_ids``: as given (ppo.py's pre-tokenized rows), or from a ``prompt`` column tokenized as ppo.py's
    ``prepare_dataset`` does (``tokenizer(prompt)``; a conversation through the chat template, ready for the
    assistant's turn). Neither column: refused, naming the columns."""
    if not isinstance(dataset, list):
        from datasets import Dataset

        if not isinstance(dataset, Dataset):
            raise ValueError(f"PPOTrainer({name}=...): a datasets.Dataset or a list of row dicts, got "
                             f"{type(dataset).__name__}")
        dataset = dataset.to_list()
    if not dataset or not all(isinstance(row, dict) for row in dataset):
        raise ValueError(f"PPOTrainer({name}=...): no rows, or rows that are not dicts of columns")
    columns = sorted(dataset[0])
    if PROMPT_IDS in columns:  # as plain ints (a list of tensors or NumPy values reads the same)
        return [{**row, PROMPT_IDS: [int(t) for t in row[PROMPT_IDS]]} for row in dataset]
    if "prompt" not in columns:
        raise ValueError(f"PPOTrainer({name}=...): TRL's PPO reads prompts as token ids from an 'input_ids' "
                         f"column (ppo.py's dataset.map(tokenize)); slimgrpo also takes a 'prompt' text column. "
                         f"This dataset has {columns}")
    out = []
    for row in dataset:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            ids = tokenizer(prompt)["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(list(prompt), tokenize=True, add_generation_prompt=True,
                                                return_dict=True)["input_ids"]
        out.append({**{k: v for k, v in row.items() if k != "prompt"}, PROMPT_IDS: list(ids)})
    return out


def check_reference(ref_model: Any, model: Any) -> None:
    """TRL's ``ref_model`` where slimgrpo keeps the reference itself: accepted when it holds the policy's initial
    weights (the base's, where the policy carries adapters), refused otherwise, naming the first tensor that
    differs."""
    if ref_model is model:
        raise ValueError("PPOTrainer: model and ref_model cannot be the same object (TRL refuses it too); pass "
                         "ref_model=None: slimgrpo keeps the reference itself")
    ours = {n.replace(".base_layer", ""): t for n, t in unwrap_causal_lm(model).state_dict().items()
            if "lora_" not in n}
    theirs = unwrap_causal_lm(ref_model).state_dict()
    differ = sorted(set(ours) ^ set(theirs)) or [
        k for k, t in ours.items() if not torch.equal(theirs[k].to(t.device, t.dtype), t)]
    if differ:
        raise ValueError(f"PPOTrainer(ref_model=...): slimgrpo's reference is the policy's initial weights (LoRA: "
                         f"the base with the adapters off; full fine-tuning: its own copy), and ref_model differs "
                         f"from them at {differ[0]!r}; pass ref_model=None or a model loaded as the policy was")


def run_tokenizer(tokenizer: Any, model: Any) -> Any:
    """The tokenizer the run uses: the script's, or a copy padding with its EOS where the script's pad token is
    not in the model's vocabulary (ppo.py adds a new ``[PAD]`` token; TRL masks it out before every forward,
    slimgrpo's masks are explicit and any token of the vocabulary pads). The script's tokenizer is the one
    saved and shown."""
    rows = unwrap_causal_lm(model).get_input_embeddings().num_embeddings
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id < rows:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ---------------------------------------------------------------------------------------- reward and metrics


class PPOScore:
    """The reward of TRL's PPO as a reward function (TRL's contract, named after the model): ``reward_model``, a
    sequence-classification model with one label, reads the prompt's token ids followed by the completion's as
    sampled (through its EOS or stop token), and its ``score`` head at the last token is the completion's
    score, as TRL's ``get_reward`` reads it at the last non-pad token; ``missing_eos_penalty`` is subtracted
    where the completion holds no ``eos_token_id``. Rows are right-padded with an attention mask, so padding
    never reaches a real token and the pad id never reaches the embedding. It logs ``val/num_eos_tokens``."""

    def __init__(self, reward_model: Any, eos_token_id: int, missing_eos_penalty: float | None,
                 device: torch.device, batch_rows: int = 32):
        try:
            self.head = reward_model.score
        except AttributeError:
            raise ValueError(f"PPOTrainer(reward_model=...): a {type(reward_model).__name__} has no score head; "
                             "TRL's PPO takes a sequence-classification model (num_labels=1)") from None
        self.model = reward_model.to(device).eval()
        self.backbone = reward_model.base_model
        self.device = device
        self.eos_token_id, self.penalty, self.batch_rows = eos_token_id, missing_eos_penalty, batch_rows
        name = str(reward_model.config._name_or_path or "").rstrip("/").split("/")[-1]
        self.__name__ = name or type(reward_model).__name__

    def scores(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[float]:
        """The model's score of each prompt + completion (no penalty)."""
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(prompt_ids), self.batch_rows):
                seqs = [list(p) + list(c) for p, c in zip(prompt_ids[start:start + self.batch_rows],
                                                          completion_ids[start:start + self.batch_rows])]
                ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, seq in enumerate(seqs):
                    ids[i, :len(seq)] = torch.tensor(seq)
                    mask[i, :len(seq)] = 1
                hidden = self.backbone(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                       use_cache=False)[0]
                last = hidden[torch.arange(len(seqs)), (mask.sum(1) - 1).to(self.device)]
                out += self.head(last).float().squeeze(-1).cpu().tolist()
        return out

    def __call__(self, prompts: list, completions: list, completion_ids: list, log_metric=None,
                 **columns) -> list[float]:
        scores = self.scores(columns[PROMPT_IDS], completion_ids)
        ended = [self.eos_token_id in ids for ids in completion_ids]
        if self.penalty is not None:
            scores = [s if e else s - self.penalty for s, e in zip(scores, ended)]
        if log_metric is not None:
            log_metric("val/num_eos_tokens", sum(list(ids).count(self.eos_token_id) for ids in completion_ids))
        return scores


# slimgrpo's metric -> TRL PPO's name for the same figure (log_history carries both)
_SAME_FIGURE = {"loss/policy_avg": "loss", "loss/value_avg": "value/loss", "val/clipfrac_avg": "value/clipfrac",
                "policy/entropy_avg": "entropy", "objective/scores": "reward", "lr": "learning_rate"}


def ppo_metrics(metrics: dict[str, Any], kl_coef: float) -> dict[str, float]:
    """TRL 1.12 PPO's names for a step's figures that slimgrpo has: the same numbers renamed (``_SAME_FIGURE``),
    ``policy/clipfrac_avg`` (the tokens where the clip acted, low + high), and the KL per completion that TRL's
    ``objective/kl`` sums over a completion's tokens (slimgrpo's per-token mean times the mean length), with the
    rewards built from it: ``objective/non_score_reward`` (-kl_coef x that KL) and ``objective/rlhf_reward``
    (score + non-score reward). TRL's ``objective/entropy``, ``policy/approxkl_avg``, ``val/ratio`` and
    ``val/ratio_var`` have no slimgrpo figure and are not logged."""
    out = {trl: metrics[ours] for trl, ours in _SAME_FIGURE.items() if ours in metrics}
    if "clip_ratio/low_mean" in metrics and "clip_ratio/high_mean" in metrics:
        out["policy/clipfrac_avg"] = metrics["clip_ratio/low_mean"] + metrics["clip_ratio/high_mean"]
    non_score = 0.0
    if kl_coef and "ppo/kl_penalty" in metrics and "completions/mean_length" in metrics:
        out["objective/kl"] = metrics["ppo/kl_penalty"] / kl_coef * metrics["completions/mean_length"]
        non_score = -kl_coef * out["objective/kl"]
    out["objective/non_score_reward"] = non_score
    if "reward" in metrics:
        out["objective/rlhf_reward"] = metrics["reward"] + non_score
    return out


class PPOEvents(TrainerEvents):
    """``TrainerEvents`` logging every rollout, as TRL's PPO does, with TRL PPO's names added (``ppo_metrics``),
    the ``episode`` count (completions so far) and ``eps`` (episodes a second)."""

    def __init__(self, handler, args, state, control, kl_coef: float):
        super().__init__(handler, args, state, control, logging_steps=1)
        self.kl_coef = kl_coef

    def step_end(self, loop: Any, step: int, metrics: dict[str, Any]) -> bool:
        episode = step * loop.cfg.run.batch_size
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        named = {**metrics, **ppo_metrics(metrics, self.kl_coef), "episode": episode, "eps": int(episode / elapsed)}
        return super().step_end(loop, step, named)
