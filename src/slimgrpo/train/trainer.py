"""The Python API: ``Trainer(cfg, callbacks=..., train_dataset=..., tools=..., environment_factory=...,
rollout_func=...).train()``, as TRL's ``GRPOTrainer`` is called.

    from slimgrpo import Trainer, load_config
    Trainer(load_config("run.yaml"), callbacks=[my_callback]).train()

A ``Trainer`` is the step loop (``train/loop.py``'s ``TrainLoop``) with a constructor that prepares the run from
its config, in the order that matters (``prepare_run``):

1. the tokenizer and the prompts (``train/prompts.py``), before any weight: a bad row stops the run before a
   multi-minute load, and the plan counts prompts at the longest the run reads;
2. the admission (``plan/admission.py``): the plan, checked against ``memory.budget`` (refused or fitted), and
   what the plan decides for the run (the resolved spec), from above the training path;
3. the build (``train/build.py``'s ``build_run``), which applies the admission's verdict.

``Trainer(parts)`` takes parts built already (``build_run(cfg, RunInputs(...))``: a lock already held, a stop
request made before the build). A ``policy`` loaded by the caller is planned from its own config and checked
against ``memory.budget``, never fitted (it exists already).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.config import Config
from slimgrpo.distributed.context import DistContext, from_environment
from slimgrpo.modeling import Policy
from slimgrpo.plan.admission import admit
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.train.build import RunInputs, RunParts, build_run
from slimgrpo.train.loop import Callback, NonFiniteError, PolicyCollapsedError, StepResult, TrainLoop
from slimgrpo.train.prompts import planned_prompt_tokens, read_prompts, run_tokenizer

__all__ = ["Callback", "NonFiniteError", "PolicyCollapsedError", "StepResult", "Trainer", "prepare_run"]


def prepare_run(cfg: Config, inputs: RunInputs) -> RunParts:
    """The run of ``cfg`` read, admitted and built (module docstring): ``RunInputs`` as ``build_run`` takes it,
    without the prompts and admission, which are made here (and the tokenizer, unless the caller loaded it:
    TRL's ``processing_class``)."""
    if inputs.train_dataset is not None:  # TRL's name: a list of row dicts or a datasets.Dataset, not a file
        cfg.data.path = inputs.train_dataset
    dist, policy = inputs.dist, inputs.policy
    tokenizer = policy.tokenizer if policy is not None else inputs.tokenizer or run_tokenizer(cfg)
    prompts = read_prompts(cfg, tokenizer)  # before the weights: the plan counts prompts at the longest
    prompt_tokens = planned_prompt_tokens(cfg, prompts, inputs.agent)
    if policy is None:
        admission = admit(cfg, dist.world_size, show=dist.is_main, prompt_tokens=prompt_tokens)
    else:  # loaded by the caller: planned and checked from its own config, never fitted (it exists already)
        admission = admit(dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, fit=False)),
                          dist.world_size, show=dist.is_main, prompt_tokens=prompt_tokens, shape=_shape(policy))
    return build_run(admission.cfg, dataclasses.replace(inputs, tokenizer=tokenizer, prompts=prompts,
                                                        admission=admission))


def _shape(policy: Policy) -> ModelShape | None:
    """The shape of a policy the caller loaded, or None for an architecture the planner does not model."""
    try:
        return ModelShape.from_hf_config(unwrap_causal_lm(policy.model).config.to_dict())
    except (ValueError, KeyError, TypeError):
        return None


class Trainer(TrainLoop):
    """One run. ``run``: a ``Config`` (the run is read, admitted and built here, with the other arguments: TRL's
    ``GRPOTrainer`` names, a ``policy`` already loaded, the ranks ``dist``) or a built ``RunParts`` (then only
    ``callbacks`` may be given). ``callbacks``: ``fn(trainer, step, metrics)`` after every step; True stops the
    run."""

    def __init__(self, run: Config | RunParts, callbacks: list[Callback] | None = None,
                 dist: DistContext | None = None, policy: Policy | None = None, train_dataset: Any = None,
                 tools: list[Callable] | None = None, environment_factory: Callable | dict[str, Callable] | None = None,
                 rollout_func: Callable | None = None):
        given = {"dist": dist, "policy": policy, "train_dataset": train_dataset, "tools": tools,
                 "environment_factory": environment_factory, "rollout_func": rollout_func}
        if isinstance(run, RunParts):
            if any(v is not None for v in given.values()):
                raise TypeError("Trainer(parts) takes built parts: pass "
                                f"{', '.join(k for k, v in given.items() if v is not None)} to build_run's RunInputs")
            parts = run
        else:
            parts = prepare_run(run, RunInputs(dist or from_environment(), policy, train_dataset, tools,
                                               environment_factory, rollout_func))
        super().__init__(parts, callbacks)
