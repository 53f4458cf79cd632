"""The step loop over one run's parts (``TrainLoop``).

One step reads like the pipeline::

    batch -> generate -> score -> advantages -> update -> metrics

The parts come whole from ``train/build.py``'s ``build_run`` (a frozen ``RunParts``): the policy, the data,
the engine, the update stage, the run folder and checkpoints (checkpoint/manager.py, ``Checkpointer``), the
run's health (monitor/watch.py, ``RunWatch``: non-finite streak, collapse, stall), the metrics writer, the
evaluator. ``TrainLoop.__init__`` takes them, so a loop is complete from the moment it exists: no ``setup()``
to call, nothing to ask about later. The documented Python API, ``Trainer(cfg, callbacks=...)``, is this loop
with a constructor that reads the run's inputs, admits it and builds it (``train/trainer.py``). The run
folder's lock is held from the build until ``train()`` returns.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from slimgrpo.advantage.compute import AdvantageSettings, compute_advantages
from slimgrpo.agent.setup import CustomRollout
from slimgrpo.containers import PromptBatch, RewardOutput, Rollout
from slimgrpo.memory.attention import cpu_gqa
from slimgrpo.monitor.watch import NonFiniteError, PolicyCollapsedError
from slimgrpo.output.metrics import console_line
from slimgrpo.train.build import RunParts
from slimgrpo.train.events import RunEvents, StepFunctions
from slimgrpo.train.step_metrics import completion_samples, step_metrics

log = logging.getLogger("slimgrpo")

Callback = Callable[["TrainLoop", int, dict[str, Any]], bool | None]  # return True to stop early


__all__ = ["Callback", "NonFiniteError", "PolicyCollapsedError", "StepResult", "TrainLoop"]


@dataclass
class StepResult:
    metrics: dict[str, Any]
    rollout: Rollout
    rewards: RewardOutput
    advantages: torch.Tensor
    batch: PromptBatch
    completions: list[Any] = field(default_factory=list)


class TrainLoop:
    """One run's loop over its built ``parts`` (``train/build.py``). ``callbacks``: ``fn(loop, step, metrics)``
    after every step; True stops the run. ``events``: listeners told of the run's moments (``train/events.py``:
    the start, each step, evaluations, checkpoints, the end)."""

    def __init__(self, parts: RunParts, callbacks: list[Callback] | None = None, events: list[RunEvents] = ()):
        self.cfg, self.dist, self.output_dir = parts.cfg, parts.dist, parts.output_dir
        self.checkpoints = parts.checkpoints  # the run folder (its lock, held by rank 0 until train() ends)
        self.policy, self.model, self.critic = parts.policy, parts.model, parts.critic
        self.dataset, self.sampler, self.trainer_state = parts.dataset, parts.sampler, parts.trainer_state
        self.optimizer, self.scheduler, self.generator = parts.optimizer, parts.scheduler, parts.generator
        self.engine, self.sampling, self.reward_runner = parts.engine, parts.sampling, parts.reward_runner
        # what the advantages depend on (estimator, scaling, the reward weights), read once
        self.advantage_settings = AdvantageSettings.from_config(self.cfg, self.reward_runner.weights)
        # multi-turn with tools / environments, or TRL's rollout_func (which receives this trainer), or None
        self.agent = CustomRollout(parts.rollout_func, self) if parts.rollout_func is not None else parts.agent
        self.updater, self.watch = parts.updater, parts.watch  # the update stage; non-finite, collapse, stall
        self.writer, self.evaluator = parts.writer, parts.evaluator
        self.tiled_mlp, self.thread_info, self.spec = parts.tiled_mlp, parts.thread_info, parts.spec
        self.callbacks = list(callbacks or [])  # the Python API's step functions (``events`` holds them too)
        self.events: list[RunEvents] = [StepFunctions(self.callbacks), *events]
        self.step_idx = parts.start_step
        self.stop = parts.stop  # stop before the next step (a signal, a callback, a stall, early stopping)

    # ------------------------------------------------------------------------- the step

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        with self.dist.agree("reading the batch"):  # a failure on one rank stops every rank, with its message
            batch = self.next_batch()
        with cpu_gqa(self.policy.device.type):  # CPU: masked sdpa without repeated K/V (memory/attention.py)
            rollout, gen_s = self.generate(batch)
            with self.dist.agree("decoding and scoring rewards"):
                completions = self.decode(batch, rollout)
                rewards = self.score(batch, rollout, completions)
            advantages = self.compute_advantages(rewards)
            update = self.updater.update(rollout, advantages, self.step_idx)  # update/updater.py
        self.watch.after_update(update.skipped, self.step_idx)
        metrics = step_metrics(self.dist, self.policy.device, rollout, rewards, update, gen_s,
                               time.perf_counter() - t0)
        metrics.update({**self.engine.metrics, **update.sampler_metrics})  # vLLM: weight sync s, mismatch
        return StepResult(metrics, rollout, rewards, update.advantages, batch, completions)

    def next_batch(self) -> PromptBatch:
        indices = self.sampler.next_global_batch()
        per_rank = len(indices) // self.dist.world_size
        mine = indices[self.dist.rank * per_rank : (self.dist.rank + 1) * per_rank]
        return self.dataset.batch(mine)

    def generate(self, batch: PromptBatch) -> tuple[Rollout, float]:
        t = time.perf_counter()
        if self.agent is not None:  # multi-turn with tools, or a custom rollout function
            return self.agent.generate(batch, self.cfg.rollout.num_generations, self.sampling,
                                       self.generator), time.perf_counter() - t
        rollout = self.engine.generate(batch.prompt_ids, self.cfg.rollout.num_generations, self.sampling,
                                       self.generator)
        return rollout, time.perf_counter() - t

    def decode(self, batch: PromptBatch, rollout: Rollout) -> list[Any]:
        if rollout.conversations is not None:  # multi-turn: the messages after the prompt, as in TRL
            return rollout.conversations
        tok = self.policy.tokenizer
        texts = [
            tok.decode(ids[: int(n)].tolist(), skip_special_tokens=True)
            for ids, n in zip(rollout.completion_ids, rollout.completion_lengths)
        ]
        G = rollout.num_generations
        return [
            [{"role": "assistant", "content": t}] if not isinstance(batch.prompts[i // G], str) else t
            for i, t in enumerate(texts)
        ]

    def score(self, batch: PromptBatch, rollout: Rollout, completions: list[Any]) -> RewardOutput:
        G = rollout.num_generations
        prompts = [p for p in batch.prompts for _ in range(G)]
        columns = {k: [v for v in vals for _ in range(G)] for k, vals in batch.columns.items()}
        columns.update(rollout.reward_columns)  # e.g. TRL's `environments` for get_reward
        ids = [row[: int(n)].tolist() for row, n in zip(rollout.completion_ids, rollout.completion_lengths)]
        state = self.trainer_state
        state.global_step = self.step_idx
        state.epoch = self.step_idx * self.cfg.prompts_per_step / max(len(self.dataset), 1)  # before this batch
        return self.reward_runner.score(prompts, completions, ids, columns, trainer_state=state)

    def compute_advantages(self, rewards: RewardOutput) -> torch.Tensor:
        """The step's [rows] advantages (``advantage/compute.py``): rows with no reward (NaN) get 0."""
        return compute_advantages(rewards, self.advantage_settings, self.dist, self.policy.device)

    # ------------------------------------------------------------------------- the loop

    def train(self) -> dict[str, Any]:
        """Train (a finished run: say so and return); the run folder's lock is released and the engine closed
        however this ends."""
        try:
            if self.checkpoints.plan.finished is not None:
                return self.checkpoints.already_finished()
            return self.train_loop()
        finally:
            self.checkpoints.release()
            self.engine.close()  # vLLM: its weights and KV pool

    @property
    def run_lock(self):
        """The run folder's lock while rank 0 holds it (``checkpoints.run_lock``), else None."""
        return self.checkpoints.run_lock

    def train_loop(self) -> dict[str, Any]:
        cfg = self.cfg
        from slimgrpo.output.console import banner_lines, print_banner, print_eval
        from slimgrpo.output.progress import Progress

        t_start = time.perf_counter()
        ev = self.evaluator
        print_banner(self.dist.is_main, banner_lines(cfg, self.policy, self.dist.world_size, self.step_idx,
                                                     ev.num_prompts if ev else None, self.output_dir))
        saved_at = None  # the step of the checkpoint written last in this loop
        if ev and self.step_idx == 0 and self.checkpoints.plan.resume_from is None:  # (a resumed run has it)
            before = ev.run()
            judged = self.watch.judge(0, before)  # run.keep_best: the model it starts from is a candidate too
            self.writer.log(0, before)
            print_eval(self.dist.is_main, ev.num_prompts, "before training", before)
            self._tell("evaluated", 0, before)
            if judged is not None and judged.improved:
                self._tell("saved", 0, self.checkpoints.save(0))
                saved_at = 0
        self._tell("train_begin")
        with Progress(cfg.run.max_steps, start=self.step_idx, enabled=self.dist.is_main,
                      bar=cfg.log.progress) as bar:
            while self.step_idx < cfg.run.max_steps and not self.should_stop():
                self._tell("step_begin", self.step_idx + 1)
                result = self.step()
                self.step_idx += 1
                evaluated = ev.after_step(self.step_idx) if ev else {}  # every eval.steps steps and after the last
                result.metrics.update(evaluated)
                if self.watch.observe(self.step_idx, result.metrics):  # stall/* into the record; a stall may stop
                    self.stop.requested = True
                judged = self.watch.judge(self.step_idx, result.metrics)  # run.keep_best, early stopping: best/*
                if judged is not None and judged.stop:
                    self.stop.requested = True
                self.writer.log(self.step_idx, result.metrics)
                self.watch.check(self.step_idx, result.metrics)  # a collapsed policy: PolicyCollapsedError
                self.maybe_log_completions(result)
                bar.advance(console_line(self.step_idx, result.metrics) if self.step_idx % cfg.log.logging_steps == 0
                            else None)
                if any([e.step_end(self, self.step_idx, result.metrics) for e in self.events]):
                    self.stop.requested = True
                if evaluated:
                    self._tell("evaluated", self.step_idx, evaluated)
                periodic = cfg.run.save_steps and self.step_idx % cfg.run.save_steps == 0
                if (periodic and self.watch.healthy) or (judged is not None and judged.improved):
                    # not while skipped or collapsed: keep the last good one (a new best is saved whatever
                    # save_steps says: final/ comes from it)
                    self._tell("saved", self.step_idx, self.checkpoints.save(self.step_idx))
                    saved_at = self.step_idx
        self.watch.check_at_end(self.step_idx, self.stop.requested)  # last updates non-finite: not a success
        if not (cfg.run.save_steps and self.step_idx % cfg.run.save_steps == 0) and saved_at != self.step_idx:
            self._tell("saved", self.step_idx, self.checkpoints.save(self.step_idx))
        summary = self.finish(t_start)
        self._tell("train_end", summary)
        return summary

    def _tell(self, moment: str, *args) -> None:
        """Every listener's ``moment`` (``RunEvents``), with this loop first."""
        for listener in self.events:
            getattr(listener, moment)(self, *args)

    def should_stop(self) -> bool:
        """Stop before the next step? Under torchrun every rank gets the same answer: a signal or a callback
        can reach the ranks at different steps, and a rank that stopped alone would leave the others waiting."""
        agreed = self.dist.any_true(self.stop.requested)
        if agreed:
            self.stop.requested = True
        return agreed

    def maybe_log_completions(self, result: StepResult) -> None:
        n, every = self.cfg.log.num_completions_to_log, self.cfg.log.log_completions_steps
        if not every or self.step_idx % every or not self.dist.is_main:
            return
        self.writer.log_completions(self.step_idx, completion_samples(result, n))

    def finish(self, t_start: float) -> dict[str, Any]:
        """summary.json (``t_start``: when the loop began, for ``wall_time_s``), the final model, the writer
        closed."""
        summary: dict[str, Any] = {"steps": self.step_idx}
        history = self.writer.history()
        if history:
            last = history[-1]
            summary.update({k: v for k, v in last.items() if k != "step"})
        from slimgrpo.evaluate.during import eval_summary

        best_step = self.watch.best.step if self.watch.best is not None else None
        summary.update(eval_summary(history, self.step_idx if self.evaluator else None, best_step))
        summary["wall_time_s"] = time.perf_counter() - t_start
        summary.update({"data/prompts": len(self.dataset), "data/prompts_truncated": self.dataset.num_truncated,
                        "data/prompts_skipped": self.dataset.num_skipped})
        # Unfinished: the checkpoint is what counts, no "final" model yet. Every rank decides alike (the
        # final save is collective under FSDP2), even when the signal reached only some of them.
        preempted = self.step_idx < self.cfg.run.max_steps and self.dist.any_true(self.stop.signal is not None)
        if preempted:
            summary["preempted_by"] = self.stop.signal or "a signal to another rank"
        summary.update(self.watch.summary_fields())
        # A stall stop writes no final/ (the stalled model is no result), unless run.keep_best holds a best model.
        kept_best = self.cfg.run.keep_best and best_step is not None
        if self.cfg.run.save_model and not preempted and (self.watch.stalled is None or kept_best):  # every rank
            summary.update(self.checkpoints.save_final(best_step, self.step_idx))  # run.keep_best: the best
        if self.dist.is_main:
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.writer.close()
        return summary
