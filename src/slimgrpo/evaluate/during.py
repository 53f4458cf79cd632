"""Evaluation during training (``eval.*``; TRL's ``eval_dataset`` / ``eval_steps``).

Held-out prompts are evaluated before the first step, every ``eval.steps`` steps and after the last one:
greedy accuracy (temperature 0, one completion per prompt), sampled accuracy and the unbiased pass@k
(``eval.num_samples`` completions per prompt at ``eval.temperature``), the mean weighted reward and each
reward function's mean. "Correct" = the first reward function scores at least ``eval.threshold``.

Under torchrun every rank evaluates an equal share of the prompts with the trainer's rollout engine (so
FSDP2 gathers weights the same way as in training) and the counts are summed across ranks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from slimgrpo.data import PromptDataset
from slimgrpo.evaluate import EvalResult, EvalSettings, evaluate
from slimgrpo.output.console import print_eval
from slimgrpo.output.metrics import EVAL_PREFIX


class DuringTrainingEval:
    """Built with the run (``train/build.py``); ``None`` from :func:`make_evaluator` when ``eval.data`` is empty.

    ``engine``: the run's rollout engine; ``agent``: its multi-turn rollout for tools / environments (the same
    as training's), else None (a custom rollout function is not used to evaluate)."""

    def __init__(self, cfg, dist, policy, reward_runner, engine, agent, sampling, dataset: PromptDataset):
        self.run_cfg, self.dist, self.policy = cfg, dist, policy
        self.reward_runner, self.engine, self.agent = reward_runner, engine, agent
        self.cfg = cfg.eval
        self.dataset = dataset  # eval.data, read with the training prompts before the weights (train/prompts.py)
        world, rank = dist.world_size, dist.rank
        per_rank = len(self.dataset) // world  # equal shares: every rank runs the same generate calls
        if per_rank == 0:
            raise ValueError(f"eval.data={cfg.eval.data!r} has {len(self.dataset)} prompts, fewer than the "
                             f"{world} processes: give at least {world}")
        self.indices = tuple(range(rank * per_rank, (rank + 1) * per_rank))
        self.num_prompts = per_rank * world
        temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.rollout.temperature
        self.sampled = dataclasses.replace(sampling, temperature=temperature)
        self.greedy = dataclasses.replace(sampling, temperature=0.0)
        # Prompts per generate call: about the rows of one training step (what we know fits).
        self.prompts_per_batch = max(1, cfg.run.batch_size // dist.world_size // cfg.eval.num_samples)

    def due(self, step: int) -> bool:
        """After optimizer step ``step``: every ``eval.steps`` steps, and after the last step."""
        every = self.cfg.steps
        return step >= self.run_cfg.run.max_steps or bool(every and step % every == 0)

    def after_step(self, step: int) -> dict[str, float]:
        if not self.due(step):
            return {}
        metrics = self.run()
        if step % self.run_cfg.log.logging_steps:  # a logged step shows it in its metrics line
            print_eval(self.dist.is_main, self.num_prompts, f"after step {step}", metrics)
        return metrics

    def _evaluate(self, sampling, num_samples: int) -> EvalResult:
        settings = EvalSettings(sampling, num_samples=num_samples, ks=(num_samples,),
                                prompts_per_batch=self.prompts_per_batch, seed=self.run_cfg.run.seed,
                                success_threshold=self.cfg.threshold, indices=self.indices)
        return evaluate(self.policy.model, self.policy.tokenizer, self.dataset, self.reward_runner, settings,
                        engine=self.engine, agent=self.agent)

    def run(self) -> dict[str, float]:
        """Evaluate now; ``eval/...`` metrics averaged over every rank's prompts, and ``time/eval_s`` (its wall
        time, shown in the step line: what evaluating every ``eval.steps`` steps costs)."""
        t0 = time.perf_counter()
        n = self.cfg.num_samples
        greedy = self._evaluate(self.greedy, 1)
        sampled = self._evaluate(self.sampled, n)
        names = list(sampled.per_function)
        local = [greedy.accuracy, sampled.accuracy, sampled.pass_at.get(n, math.nan), sampled.mean_reward]
        local += [sampled.per_function[k] for k in names]
        values = self._mean_over_ranks(local)
        out = {f"{EVAL_PREFIX}accuracy_greedy": values[0], f"{EVAL_PREFIX}accuracy_sampled": values[1]}
        if n > 1:
            out[f"{EVAL_PREFIX}pass@{n}"] = values[2]
        out[f"{EVAL_PREFIX}mean_reward"] = values[3]
        for name, v in zip(names, values[4:]):
            out[f"{EVAL_PREFIX}rewards/{name}"] = v
        out["time/eval_s"] = time.perf_counter() - t0
        return out

    def _mean_over_ranks(self, values: list[float]) -> list[float]:
        d = self.dist
        if not d.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.policy.device)
        return (d.all_reduce_sum(t) / d.world_size).cpu().tolist()  # equal shares: the mean of the means


def make_evaluator(cfg, dist, policy, reward_runner, engine, agent, sampling,
                   dataset: PromptDataset | None) -> DuringTrainingEval | None:
    """The run's evaluator (``DuringTrainingEval``'s arguments; ``dataset``: ``eval.data``'s prompts), or None
    without ``eval.data``."""
    return DuringTrainingEval(cfg, dist, policy, reward_runner, engine, agent, sampling, dataset) \
        if cfg.eval.data else None


def eval_summary(history: list[dict[str, Any]], final_step: int | None = None,
                 best_step: int | None = None) -> dict[str, Any]:
    """``eval_before/...`` (the step-0 record) and ``eval_after/...`` (the newest eval after a training step)
    for summary.json. With ``final_step`` (the run's last step) and no eval at it, ``eval_skipped_at_step``
    says so: a run stopped early (a signal, a callback) skips the evaluation after its last step. With
    ``best_step`` (``run.keep_best``: the step whose model ``final/`` holds), ``eval_best/...`` is that
    step's evaluation (step 0: the one before training)."""
    evals = [r for r in history if any(k.startswith(EVAL_PREFIX) for k in r)]
    out: dict[str, Any] = {}
    if evals and evals[0].get("step") == 0:
        out.update({f"eval_before/{k[len(EVAL_PREFIX):]}": v for k, v in evals[0].items() if k.startswith(EVAL_PREFIX)})
    after = [r for r in evals if r.get("step")]  # the step-0 record is "before", never "after"
    if after:
        out.update({f"eval_after/{k[len(EVAL_PREFIX):]}": v for k, v in after[-1].items() if k.startswith(EVAL_PREFIX)})
        out["eval_after/step"] = after[-1].get("step")
    at_best = [r for r in evals if best_step is not None and r.get("step") == best_step]
    if at_best:
        out.update({f"eval_best/{k[len(EVAL_PREFIX):]}": v for k, v in at_best[-1].items() if k.startswith(EVAL_PREFIX)})
        out["eval_best/step"] = best_step
    if final_step and out.get("eval_after/step") != final_step:
        out["eval_skipped_at_step"] = final_step
    return out
