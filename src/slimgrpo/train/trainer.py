"""The GRPO trainer: setup and the step loop.

One step reads like the pipeline::

    batch -> generate -> score -> advantages -> update (update/: prepare, step) -> metrics

The loop calls two components beside the update: the run folder and checkpoints (checkpoint/manager.py,
``Checkpointer``) and the run's health (monitor/watch.py, ``RunWatch``: non-finite streak, collapse, stall).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from slimgrpo.advantage import estimators as adv
from slimgrpo import threads
from slimgrpo.config import Config, check_context_length, dump_config, resolve_path
from slimgrpo.data import PromptDataset, PromptSampler, check_enough_prompts, load_prompt_dataset, steps_for_epochs
from slimgrpo.config.validate import loss_warnings
from slimgrpo.memory.attention import cpu_gqa
from slimgrpo.memory.malloc import pin_mmap_threshold
from slimgrpo.plan.planner import decode_packing
from slimgrpo.modeling import (Policy, build_policy, generation_eos_ids, looks_like_hub_name, max_positions,
                               read_model_config)
from slimgrpo.rewards.loading import load_reward_functions
from slimgrpo.rewards.contract import make_trainer_state
from slimgrpo.rewards.scoring import RewardRunner
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.rollout.vllm_engine import resolve_engine
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.train import seeding
from slimgrpo.checkpoint.manager import CheckpointParts, Checkpointer
from slimgrpo.update.critic import build_critic
from slimgrpo.distributed import wrap as launch
from slimgrpo.distributed.context import DistContext, from_environment
from slimgrpo.output.metrics import MetricsWriter, console_line
from slimgrpo.train.step_metrics import UpdateOutcome, completion_samples, scorable_total, step_metrics
from slimgrpo.update.optim import build_optimizer, build_scheduler
from slimgrpo.update.sampler_correction import correct_for_sampler
from slimgrpo.update.updater import Updater, trainable_parameters
from slimgrpo.monitor.watch import NonFiniteError, PolicyCollapsedError, RunWatch
from slimgrpo.containers import PromptBatch, RewardOutput, Rollout

log = logging.getLogger("slimgrpo")

Callback = Callable[["Trainer", int, dict[str, Any]], bool | None]  # return True to stop early


__all__ = ["Callback", "NonFiniteError", "PolicyCollapsedError", "StepResult", "Trainer"]


@dataclass
class StepResult:
    metrics: dict[str, Any]
    rollout: Rollout
    rewards: RewardOutput
    advantages: torch.Tensor
    batch: PromptBatch
    completions: list[Any] = field(default_factory=list)


class Trainer:
    def __init__(self, cfg: Config, callbacks: list[Callback] | None = None, dist: DistContext | None = None,
                 policy: Policy | None = None, train_dataset: Any = None, tools: list[Callable] | None = None,
                 environment_factory: Callable | dict[str, Callable] | None = None,
                 rollout_func: Callable | None = None):
        if train_dataset is not None:  # TRL's name: a list of row dicts or a datasets.Dataset, instead of a file
            cfg.data.path = train_dataset
        self.cfg = cfg
        # TRL's GRPOTrainer arguments; callables in place of rollout.tools / environment / rollout_function.
        self.agent_args = {"tools": tools, "environment": environment_factory, "rollout_func": rollout_func}
        self.callbacks = list(callbacks or [])
        self.dist = dist or from_environment()
        # Like TRL's output_dir: relative to the working directory, whether or not it exists yet.
        self.output_dir = Path(cfg.run.output_dir).expanduser().absolute()
        self._policy = policy
        self.step_idx = 0
        self.stop_requested = False
        self.preempted_by: str | None = None  # signal name when SIGTERM/SIGINT stopped the run
        # The run folder (its lock, held by rank 0 from setup() to the end of train()) and checkpoints
        self.checkpoints = Checkpointer(cfg, self.dist, self.output_dir)
        self.critic = None  # PPO's value function (update/critic.py), built in setup()
        self.watch: RunWatch | None = None  # non-finite streak, collapse, stall (monitor/watch.py), built in setup()

    # ------------------------------------------------------------------------- setup

    def setup(self) -> None:
        cfg = self.cfg
        self.thread_info = threads.apply(cfg.run.num_threads, cfg.run.thread_wait_policy)
        pin_mmap_threshold()  # freed update tensors go back to the system (memory/malloc.py, issue 12)
        seeding.seed_all(cfg.run.seed)  # torch, Python and NumPy: the same seed gives the same run
        if cfg.run.full_determinism:  # TRL's switch: deterministic GPU kernels too
            seeding.enable_full_determinism()
        self.checkpoints.lock_folder()  # one writer per folder; rank 0 holds the lock
        model_path = resolve_path(cfg, cfg.model.path)
        if self._policy is None:
            mconf = {} if looks_like_hub_name(model_path) else read_model_config(model_path)
            check_context_length(cfg, max_positions(mconf), model_path)
            from slimgrpo.plan.check import check_before_training
            from slimgrpo.trace.step import trace_step  # memory.fit=trace: the trace of this config's step

            # Before any weights load: print the plan; refuse (or fit) a run over memory.budget.
            self.cfg, memory_plan = check_before_training(cfg, self.dist.world_size, show=self.dist.is_main,
                                                          trace_fn=trace_step)
            cfg = self.cfg
        else:
            memory_plan = None
        reward_functions = load_reward_functions(cfg.rewards.functions, cfg.base_dir, cfg.run.device)
        self.policy = self._policy or build_policy(cfg)
        from slimgrpo.plan.check import apply_tiled_mlp

        # memory.tiled_mlp: the MLPs run shard by shard where the plan says so (memory/tiled_mlp.py)
        self.tiled_mlp = apply_tiled_mlp(cfg, self.policy.model, memory_plan, show=self.dist.is_main,
                                         distributed=self.dist.enabled)
        if memory_plan is not None and cfg.memory.offload_activations and self.policy.device.type == "cuda":
            from slimgrpo.memory.pinned import set_activation_cap

            # pinned host memory for offloaded activations: at most the plan's host line (memory/pinned.py)
            set_activation_cap(self.policy.device, memory_plan.bytes_of("offloaded checkpoints") or None)
        self.dataset: PromptDataset = load_prompt_dataset(resolve_path(cfg, cfg.data.path), self.policy.tokenizer,
                                                          cfg.data)
        check_enough_prompts(len(self.dataset), cfg.prompts_per_step, cfg.run.batch_size, cfg.rollout.num_generations)
        if cfg.prompts_per_step % self.dist.world_size:
            raise ValueError(
                f"run.batch_size={cfg.run.batch_size} gives {cfg.prompts_per_step} prompts per step, which "
                f"{self.dist.world_size} processes cannot share evenly: use a multiple of "
                f"{self.dist.world_size * cfg.rollout.num_generations}"
            )
        if cfg.run.num_train_epochs is not None:  # TRL's num_train_epochs: the run length from the data size
            cfg.run.max_steps = steps_for_epochs(cfg.run.num_train_epochs, len(self.dataset), cfg.prompts_per_step)
        self.sampler = PromptSampler(len(self.dataset), cfg.prompts_per_step, cfg.run.seed, cfg.data.shuffle)
        self.trainer_state = make_trainer_state(  # what TRL passes reward functions as ``trainer_state``
            cfg.run.max_steps, cfg.run.max_steps * cfg.prompts_per_step / max(len(self.dataset), 1),
            cfg.run.batch_size, cfg.log.logging_steps, cfg.run.save_steps, self.dist.is_main)
        self.critic = build_critic(cfg, self.policy, self.dist) if cfg.ppo else None  # PPO's value function
        self.model = self.wrap_model(self.policy.model)
        if self.critic is not None:
            self.critic.attach(self.model, cfg.distributed.strategy)
        self.optimizer = build_optimizer(trainable_parameters(self.policy, self.critic), cfg, self.policy.device)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.generator = torch.Generator(device=self.policy.device).manual_seed(cfg.run.seed + 7919 * self.dist.rank)
        if resolve_engine(cfg.rollout.engine, cfg.run.device) == "vllm":  # colocated vLLM (rollout/vllm_engine.py)
            from slimgrpo.rollout.vllm_engine import VllmRolloutEngine, VllmSettings

            self.engine = VllmRolloutEngine(self.policy.model, VllmSettings.from_config(cfg, model_path,
                                                                                        self.policy.model))
        else:
            self.engine = TorchRolloutEngine(self.policy.model, max_batch_rows=cfg.rollout.max_batch_rows,
                                             kv_cache_dtype=cfg.rollout.kv_cache_dtype,
                                             pack_weights=decode_packing(memory_plan.shape, memory_plan.inputs)
                                             if memory_plan is not None else "auto")
        if self.dist.enabled:  # FSDP2: generation gathers the sharded weights; DDP: a failure stops every rank
            self.engine = launch.wrap_engine(self.engine, self.model, cfg, self.dist)
        from slimgrpo.rollout.agent_setup import setup_agent

        self.agent, agent_rewards = setup_agent(self)  # tools / environments / rollout_function, or None
        self.agent = launch.guard_agent(self.agent, self.model, cfg, self.dist)
        self.reward_runner = RewardRunner(
            reward_functions + agent_rewards,
            None if cfg.rewards.reward_weights is None else [*cfg.rewards.reward_weights, *[1.0] * len(agent_rewards)],
            on_error=cfg.rewards.on_error, timeout_s=cfg.rewards.timeout_s, isolation=cfg.rewards.isolation,
            max_failed_steps=cfg.rewards.max_failed_steps,
        )
        tok = self.policy.tokenizer
        eos = {tok.eos_token_id} | set(generation_eos_ids(self.policy.model))
        r = cfg.rollout
        self.sampling = SamplingParams(
            max_new_tokens=r.max_completion_length, min_new_tokens=r.min_completion_length,
            temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
            repetition_penalty=r.repetition_penalty,
            eos_token_ids=tuple(sorted(eos)), pad_token_id=tok.pad_token_id,
        )
        # The update stage (update/): old / reference log-probs, the loss, the optimizer steps
        self.updater = Updater(cfg, self.policy, self.model, self.optimizer, self.scheduler, self.dist, self.critic)
        # a collapsed policy stops the run (exit 3); run.stop_on_stall stops at a stall (exit 5)
        self.watch = RunWatch(cfg, self.dist, self.output_dir, self.policy.model)
        for warning in loss_warnings(cfg) if self.dist.is_main else []:
            log.warning(warning)
        plan = self.checkpoints.plan_folder()  # resume, fresh, refuse, or already finished: before writing
        if plan.finished is not None:
            return
        backends = []
        if self.dist.is_main:  # one run per job in wandb / mlflow, not one per rank
            from slimgrpo.output.backends import make_backends

            backends = make_backends(cfg.log.report_to, self.output_dir, cfg.to_dict())
        self.writer = MetricsWriter(self.output_dir, enabled=self.dist.is_main, backends=backends)
        if self.dist.is_main:
            dump_config(cfg, self.output_dir / "config.yaml")
            threads.record(self.output_dir, self.thread_info)
        from slimgrpo.evaluate.during import make_evaluator

        self.evaluator = make_evaluator(self)  # eval.data: held-out prompts, or None
        self.checkpoints.attach(CheckpointParts(self.policy, self.optimizer, self.scheduler, self.sampler,
                                                self.generator, self.updater, self.watch, self.writer, self.critic))
        self.step_idx = self.checkpoints.resume()

    def wrap_model(self, model):
        """Hook for distributed wrappers (DDP / FSDP2); a LoRA critic's adapter is synchronised by the critic."""
        if not self.dist.enabled:
            return model
        return launch.wrap_model(model, self.cfg, self.dist, self.critic.ddp_ignored(model) if self.critic else ())

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
            update = self.updater.prepare(rollout, advantages)  # old / reference log-probs
            advantages = self.updater.critic_stage(update, advantages)  # PPO: per-token GAE advantages, critic
            # Another engine's samples: the log-prob mismatch measured, TRL's truncated IS weights applied
            off_policy = correct_for_sampler(self.updater, update, rollout.sampler_logprobs, rollout.model_mask) \
                if getattr(self.engine, "off_policy", False) else {}
            stats, grad_norm, skipped = self.updater.step(update, self.step_idx)
        self.watch.after_update(skipped, self.step_idx)
        outcome = UpdateOutcome.of(self.updater, stats, grad_norm, skipped)
        metrics = step_metrics(self.dist, self.policy.device, rollout, rewards, outcome, gen_s,
                               time.perf_counter() - t0)
        metrics.update({**getattr(self.engine, "metrics", {}), **off_policy})  # vLLM: weight sync s, mismatch
        return StepResult(metrics, rollout, rewards, advantages, batch, completions)

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
        """Unscorable rows (every function returned None) are NaN here: left out of the baselines, advantage 0."""
        L, G = self.cfg.loss, self.cfg.rollout.num_generations
        total = scorable_total(rewards)
        if L.multi_objective_aggregation == "normalize_then_sum":
            weights = torch.tensor(self.reward_runner.weights, dtype=torch.float32)
            total = adv.normalize_then_sum(rewards.per_function, weights, G)
            mean, std = adv.global_nan_moments(total.to(self.policy.device), self.dist.all_reduce_sum)
            return adv.batch_normalised(total.to(self.policy.device), mean, std)
        batch_std = None
        if L.scale_rewards == "batch" and self.dist.enabled:
            batch_std = adv.global_nan_moments(total.to(self.policy.device), self.dist.all_reduce_sum)[1].cpu()
        return adv.compute_advantages(total, G, L.advantage_estimator, L.scale_rewards,
                                      batch_std).to(self.policy.device)

    # ------------------------------------------------------------------------- the loop

    def train(self) -> dict[str, Any]:
        """Set up (when needed) and train; the run folder's lock is released however this ends."""
        try:
            if not hasattr(self, "policy"):
                self.setup()
            if self.checkpoints.plan.finished is not None:
                return self.checkpoints.already_finished()
            return self.train_loop()
        finally:
            self.checkpoints.release()
            getattr(getattr(self, "engine", None), "close", lambda: None)()  # vLLM: its weights and KV pool

    @property
    def run_lock(self):
        """The run folder's lock while rank 0 holds it (``checkpoints.run_lock``), else None."""
        return self.checkpoints.run_lock

    def train_loop(self) -> dict[str, Any]:
        cfg = self.cfg
        from slimgrpo.output.console import print_banner, print_eval
        from slimgrpo.output.progress import Progress

        self.t_start = time.perf_counter()
        print_banner(self)
        saved_at = None  # the step of the checkpoint written last in this loop
        if self.evaluator and self.step_idx == 0 and self.checkpoints.plan.resume_from is None:  # (a resumed run
            before = self.evaluator.run()                                                     # has it already)
            judged = self.watch.judge(0, before)  # run.keep_best: the model it starts from is a candidate too
            self.writer.log(0, before)
            print_eval(self, "before training", before)
            if judged is not None and judged.improved:
                self.checkpoints.save(0)
                saved_at = 0
        with Progress(cfg.run.max_steps, start=self.step_idx, enabled=self.dist.is_main,
                      bar=cfg.log.progress) as bar:
            while self.step_idx < cfg.run.max_steps and not self.should_stop():
                result = self.step()
                self.step_idx += 1
                if self.evaluator:  # every eval.steps steps and after the last one
                    result.metrics.update(self.evaluator.after_step(self.step_idx))
                if self.watch.observe(self.step_idx, result.metrics):  # stall/* into the record; a stall may stop
                    self.stop_requested = True
                judged = self.watch.judge(self.step_idx, result.metrics)  # run.keep_best, early stopping: best/*
                if judged is not None and judged.stop:
                    self.stop_requested = True
                self.writer.log(self.step_idx, result.metrics)
                self.watch.check(self.step_idx, result.metrics)  # a collapsed policy: PolicyCollapsedError
                self.maybe_log_completions(result)
                bar.advance(console_line(self.step_idx, result.metrics) if self.step_idx % cfg.log.logging_steps == 0
                            else None)
                if any(cb(self, self.step_idx, result.metrics) for cb in self.callbacks):
                    self.stop_requested = True
                periodic = cfg.run.save_steps and self.step_idx % cfg.run.save_steps == 0
                if (periodic and self.watch.healthy) or (judged is not None and judged.improved):
                    self.checkpoints.save(self.step_idx)  # not while skipped or collapsed: keep the last good one
                    saved_at = self.step_idx  # (a new best is saved whatever save_steps says: final/ comes from it)
        self.watch.check_at_end(self.step_idx, self.stop_requested)  # last updates non-finite: not a success
        if not (cfg.run.save_steps and self.step_idx % cfg.run.save_steps == 0) and saved_at != self.step_idx:
            self.checkpoints.save(self.step_idx)
        return self.finish()

    def should_stop(self) -> bool:
        """Stop before the next step? Under torchrun every rank gets the same answer: a signal or a callback
        can reach the ranks at different steps, and a rank that stopped alone would leave the others waiting."""
        agreed = self.dist.any_true(self.stop_requested)
        if agreed:
            self.stop_requested = True
        return agreed

    def maybe_log_completions(self, result: StepResult) -> None:
        n, every = self.cfg.log.num_completions_to_log, self.cfg.log.log_completions_steps
        if not every or self.step_idx % every or not self.dist.is_main:
            return
        self.writer.log_completions(self.step_idx, completion_samples(result, n))

    def finish(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"steps": self.step_idx}
        history = self.writer.history()
        if history:
            last = history[-1]
            summary.update({k: v for k, v in last.items() if k != "step"})
        from slimgrpo.evaluate.during import eval_summary

        best_step = self.watch.best.step if self.watch.best is not None else None
        summary.update(eval_summary(history, self.step_idx if self.evaluator else None, best_step))
        if hasattr(self, "t_start"):
            summary["wall_time_s"] = time.perf_counter() - self.t_start
        summary.update({"data/prompts": len(self.dataset), "data/prompts_truncated": self.dataset.num_truncated,
                        "data/prompts_skipped": self.dataset.num_skipped})
        # Unfinished: the checkpoint is what counts, no "final" model yet. Every rank decides alike (the
        # final save is collective under FSDP2), even when the signal reached only some of them.
        preempted = self.step_idx < self.cfg.run.max_steps and self.dist.any_true(self.preempted_by is not None)
        if preempted:
            summary["preempted_by"] = self.preempted_by or "a signal to another rank"
        summary.update(self.watch.summary_fields())
        if self.cfg.run.save_model and not preempted and self.watch.stalled is None:  # every rank: FSDP2 gathers
            summary.update(self.checkpoints.save_final(best_step, self.step_idx))  # run.keep_best: the best
        if self.dist.is_main:
            (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.writer.close()
        return summary
