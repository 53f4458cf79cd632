"""A run's prompts, read before any weight loads: the training set and ``eval.data``'s held-out set, tokenized
with the run's tokenizer (chat template applied), their seeded order, and the prompt length the memory plan
counts.

Why before the weights: the plan sizes every prompt at the longest the run will see. ``data.max_prompt_length``
is only a bound (512 by default) and real datasets sit far under it (GSM8K with SmolLM2's chat template: 153
tokens at most), so a plan at the bound over-counted the update of the real-model rows by 33-46%
(docs/benchmarks.md#plan-vs-measured). The tokenized prompts give the true longest; a bad row stops the run
before a multi-minute load instead of after it.

    tokenizer = run_tokenizer(cfg)                         # after the model folder and context length are checked
    prompts = read_prompts(cfg, tokenizer)                 # RunPrompts(train, eval)
    planned_prompt_tokens(cfg, prompts)                    # what run_spec(..., prompt_tokens=) takes
    sampler, trainer_state = prompt_order(cfg, dist, prompts.train)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from slimgrpo.config import Config, check_context_length, resolve_path
from slimgrpo.data import PromptDataset, PromptSampler, check_enough_prompts, load_prompt_dataset, steps_for_epochs
from slimgrpo.distributed.context import DistContext
from slimgrpo.distributed.process_group import split_problem
from slimgrpo.rewards.contract import make_trainer_state

__all__ = ["RunPrompts", "data_prompt_tokens", "planned_prompt_tokens", "prompt_order", "read_prompts",
           "rendered_elsewhere", "run_tokenizer"]


@dataclass(frozen=True)
class RunPrompts:
    """The training prompts and ``eval.data``'s (None without it), tokenized."""

    train: PromptDataset
    eval: PromptDataset | None = None

    @property
    def longest(self) -> int:
        """Tokens of the longest prompt of either set (after the chat template and ``data.prompt_overflow``)."""
        return max(len(ids) for ds in (self.train, self.eval) if ds is not None for ids in ds.prompt_ids)


def run_tokenizer(cfg: Config):
    """The run's tokenizer (``model.tokenizer_path``, else the model's folder), after the model folder and the
    context length are checked (a missing model folder is named as such, not as a missing tokenizer)."""
    from slimgrpo.modeling import load_run_tokenizer, looks_like_hub_name, max_positions, read_model_config

    model_path = resolve_path(cfg, cfg.model.path)
    mconf = {} if looks_like_hub_name(model_path) else read_model_config(model_path)
    check_context_length(cfg, max_positions(mconf), model_path)
    return load_run_tokenizer(cfg)


def read_prompts(cfg: Config, tokenizer) -> RunPrompts:
    """``data.path`` (or the rows the Python API put there) and ``eval.data`` (its first ``eval.max_prompts``),
    as the run reads them; a bad file or row raises ``DataError`` naming it."""
    train = load_prompt_dataset(resolve_path(cfg, cfg.data.path), tokenizer, cfg.data)
    held_out = None
    if cfg.eval.data:
        first = dataclasses.replace(cfg.data, max_samples=cfg.eval.max_prompts)  # data's template and bound
        held_out = load_prompt_dataset(resolve_path(cfg, cfg.eval.data), tokenizer, first)
    return RunPrompts(train, held_out)


def rendered_elsewhere(cfg: Config, agent_inputs: bool = False) -> bool:
    """Whether the prompts the model sees are not the dataset's: tool schemas are rendered into them
    (``rollout.tools`` / ``rollout.environment``, whose ``reset`` may add text) or a custom rollout function
    builds them (``rollout.rollout_function``); ``agent_inputs``: the Python API passed tools, environments or
    a ``rollout_func``. Their length is known only as the bound ``data.max_prompt_length``."""
    r = cfg.rollout
    return bool(agent_inputs or r.tools or r.environment or r.rollout_function)


def planned_prompt_tokens(cfg: Config, prompts: RunPrompts, agent_inputs: bool = False) -> int | None:
    """The prompt length the plan counts: the longest tokenized prompt of the run's sets, at most
    ``data.max_prompt_length``; None (the plan keeps the bound) where the prompts are rendered elsewhere."""
    if rendered_elsewhere(cfg, agent_inputs):
        return None
    return min(prompts.longest, cfg.data.max_prompt_length)


def data_prompt_tokens(cfg: Config) -> int | None:
    """:func:`planned_prompt_tokens` of ``cfg``'s data without a run: the tokenizer (``model.tokenizer_path``,
    else the model's folder) and the prompts read here, no weights (``slimgrpo plan``, the benchmarks).
    Raises ``ModelLoadError`` / ``DataError`` (ValueErrors) or OSError when they cannot be read."""
    if rendered_elsewhere(cfg):
        return None
    from slimgrpo.modeling import load_run_tokenizer

    return planned_prompt_tokens(cfg, read_prompts(cfg, load_run_tokenizer(cfg)))


def prompt_order(cfg: Config, dist: DistContext, dataset: PromptDataset) -> tuple[PromptSampler, Any]:
    """The prompts' seeded, resumable order and TRL's ``trainer_state`` for reward functions, checked against
    the run's batch (after ``memory.fit``, which may change ``rollout.num_generations``);
    ``run.num_train_epochs`` sets ``run.max_steps`` from the data size here."""
    check_enough_prompts(len(dataset), cfg.prompts_per_step, cfg.run.batch_size, cfg.rollout.num_generations)
    problem = split_problem(cfg, dist.world_size)  # (torchrun's check_job said so already, before any weight)
    if problem:
        raise ValueError(problem)
    if cfg.run.num_train_epochs is not None:  # TRL's num_train_epochs: the run length from the data size
        cfg.run.max_steps = steps_for_epochs(cfg.run.num_train_epochs, len(dataset), cfg.prompts_per_step)
    sampler = PromptSampler(len(dataset), cfg.prompts_per_step, cfg.run.seed, cfg.data.shuffle)
    trainer_state = make_trainer_state(  # what TRL passes reward functions as ``trainer_state``
        cfg.run.max_steps, cfg.run.max_steps * cfg.prompts_per_step / max(len(dataset), 1),
        cfg.run.batch_size, cfg.log.logging_steps, cfg.run.save_steps, dist.is_main)
    return sampler, trainer_state
