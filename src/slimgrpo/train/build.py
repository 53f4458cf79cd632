"""A run built whole: ``build_run(cfg, inputs) -> RunParts``, every part the step loop uses, built once.

    parts = build_run(admission.cfg, RunInputs(dist, tokenizer=..., prompts=..., admission=admission))
    TrainLoop(parts).train()                  # or, as documented: Trainer(cfg, callbacks=[...]).train()

The parts are made in one function, in the order that matters, and handed over as one frozen ``RunParts``: a
loop takes them in ``__init__`` and is complete from then on. The helpers that build a part receive the parts
they read, never the loop.

The run's admission (``plan/admission.py``: its plan against ``memory.budget``, the fit, what the plan decides
for the run) happens before this, from above (``train/trainer.py``), and reaches the build as its verdict
(``RunInputs.admission``, a ``runspec.run.Admission``), which the build applies. Without one (a policy the caller
loaded, or ``build_run`` called on its own) the run is built unplanned.

The order (each step needs the ones before it):

1. threads, the allocator's trim threshold, the seeds (before the model loads: the same seed gives the same
   run), then the run folder's lock (before anything is written; rank 0 holds it);
2. the tokenizer and the prompts where the caller has not read them (``train/prompts.py``), the reward
   functions, the policy, the admission's tiled MLP and pinned-memory cap;
3. the prompts' order, the critic (PPO), the wrapped model (DDP / FSDP2), the optimizer and its
   schedule, the sampling generator, the rollout engine, tools / environments, the reward runner;
4. the update stage and the run's watch;
5. the run folder's plan (resume, fresh, refuse, already finished): a finished run stops here, before
   anything is written, and gets a writer that writes nothing;
6. the metrics writer and its sinks, config.yaml, the evaluator, and last the resume from a checkpoint.

A build that fails releases the folder's lock and closes the engine it made (vLLM's weights and KV pool).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from rich.console import Console

from slimgrpo import threads
from slimgrpo.checkpoint.manager import CheckpointParts, Checkpointer
from slimgrpo.config import Config, dump_config, resolve_path
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.config.validate import loss_warnings
from slimgrpo.config.sections.rollout import resolve_engine
from slimgrpo.data import PromptDataset, PromptSampler
from slimgrpo.distributed import wrap as launch
from slimgrpo.distributed.context import DistContext
from slimgrpo.evaluate.during import DuringTrainingEval, make_evaluator
from slimgrpo.memory.malloc import pin_mmap_threshold
from slimgrpo.memory.tiled_mlp import tile_mlps, untile_mlps
from slimgrpo.modeling import Policy, build_policy, generation_eos_ids
from slimgrpo.monitor.watch import RunWatch
from slimgrpo.output.metrics import MetricsWriter
from slimgrpo.rewards.loading import load_reward_functions
from slimgrpo.rewards.scoring import RewardRunner
from slimgrpo.agent.rollout import AgentRollout
from slimgrpo.agent.setup import AgentInputs, setup_agent
from slimgrpo.rollout.engine import TorchRolloutEngine
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.train import seeding
from slimgrpo.runspec.run import Admission, RunSpec, tiled_mlp_setting
from slimgrpo.train.prompts import RunPrompts, planned_prompt_tokens, prompt_order, read_prompts, run_tokenizer
from slimgrpo.update.critic import Critic, build_critic
from slimgrpo.update.optim import build_optimizer, build_scheduler
from slimgrpo.update.settings import UpdateSettings
from slimgrpo.update.updater import Updater, trainable_parameters

log = logging.getLogger("slimgrpo")

__all__ = ["RunInputs", "RunParts", "StopRequest", "apply_tiled_mlp", "build_engine", "build_run"]


@dataclass
class StopRequest:
    """Whether the run should stop before its next step, and the signal that asked (SIGTERM / SIGINT, set by
    ``train/runner.py``'s handlers; ``None`` when a callback, a stall or early stopping asked). The one
    mutable part of ``RunParts``: the runner makes it before the build, so a signal during the build counts."""

    requested: bool = False
    signal: str | None = None


@dataclass(frozen=True)
class RunInputs:
    """What a caller gives a run besides its config: the ranks, and the Python API's arguments (TRL's
    ``GRPOTrainer`` names: ``train_dataset``, ``tools``, ``environment_factory``, ``rollout_func``), a
    ``policy`` already loaded, a ``run_lock`` already held on the folder (the demo), a ``stop`` request made
    before the build (the runner's signal handlers), and what was read or decided before the build: the
    ``tokenizer`` and ``prompts`` (``train/prompts.py``) and the run's ``admission``."""

    dist: DistContext
    policy: Policy | None = None
    train_dataset: Any = None
    tools: list[Callable] | None = None
    environment_factory: Callable | dict[str, Callable] | None = None
    rollout_func: Callable | None = None
    run_lock: Any = None
    stop: StopRequest | None = None
    tokenizer: Any = None
    prompts: RunPrompts | None = None
    admission: Admission | None = None

    @property
    def agent(self) -> bool:
        """Whether tools, environments or a ``rollout_func`` were given: prompts rendered elsewhere."""
        return bool(self.tools or self.environment_factory or self.rollout_func)


@dataclass(frozen=True)
class RunParts:
    """Every part of one run, built by ``build_run`` (the objects inside keep their own state)."""

    cfg: Config  # the run's config, after the memory check's fit
    dist: DistContext
    output_dir: Path
    checkpoints: Checkpointer  # the run folder (its lock, plan) and checkpoints
    policy: Policy
    dataset: PromptDataset
    sampler: PromptSampler  # the seeded, resumable order of the prompts
    trainer_state: Any  # transformers.TrainerState, what TRL hands reward functions as ``trainer_state``
    critic: Critic | None  # PPO's value function, else None
    model: torch.nn.Module  # the module the update runs: the policy's model, or its DDP / FSDP2 wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator  # sampling's random numbers (seeded per rank)
    engine: Any  # the rollout engine (rollout/engine.py, rollout/vllm_engine.py; wrapped under torchrun)
    agent: Any  # the multi-turn rollout for tools / environments (wrapped under torchrun), else None
    rollout_func: Callable | None  # TRL's rollout_func(prompts, trainer): the Trainer calls it, else None
    reward_runner: RewardRunner
    sampling: SamplingParams
    updater: Updater
    watch: RunWatch
    writer: MetricsWriter  # writes nothing on a finished run
    evaluator: DuringTrainingEval | None  # eval.data's held-out prompts, else None
    start_step: int  # the checkpoint's step on a resume, else 0
    stop: StopRequest
    tiled_mlp: bool  # whether the decoder's MLPs run tiled (memory.tiled_mlp)
    thread_info: Any  # the CPU threads the run took (recorded in the run folder)
    spec: RunSpec  # the run's resolved spec (spec/run.py), as the update and the engine read it


def build_run(cfg: Config, inputs: RunInputs) -> RunParts:
    """The run's parts, in the module docstring's order; a failure releases the folder's lock and closes the
    engine built so far."""
    if inputs.train_dataset is not None:  # TRL's name: a list of row dicts or a datasets.Dataset, not a file
        cfg.data.path = inputs.train_dataset
    # Like TRL's output_dir: relative to the working directory, whether or not it exists yet.
    output_dir = Path(cfg.run.output_dir).expanduser().absolute()
    checkpoints = Checkpointer(cfg, inputs.dist, output_dir, run_lock=inputs.run_lock)
    with contextlib.ExitStack() as undo:
        undo.callback(checkpoints.release)
        parts = _build(cfg, inputs, checkpoints, undo)
        undo.pop_all()
    return parts


def _build(cfg: Config, inputs: RunInputs, checkpoints: Checkpointer, undo: contextlib.ExitStack) -> RunParts:
    dist = inputs.dist
    thread_info = threads.apply(cfg.run.num_threads, cfg.run.thread_wait_policy)
    pin_mmap_threshold()  # freed update tensors go back to the system (memory/malloc.py)
    seeding.seed_all(cfg.run.seed)  # torch, Python and NumPy: the same seed gives the same run
    if cfg.run.full_determinism:  # TRL's switch: deterministic GPU kernels too
        seeding.enable_full_determinism()
    checkpoints.lock_folder()  # one writer per folder; rank 0 holds the lock
    model_path = resolve_path(cfg, cfg.model.path)
    tokenizer = inputs.policy.tokenizer if inputs.policy is not None else inputs.tokenizer or run_tokenizer(cfg)
    prompts = inputs.prompts or read_prompts(cfg, tokenizer)  # a bad row stops the run before the weights load
    admission = inputs.admission or Admission.unplanned(
        cfg, dist.world_size, planned_prompt_tokens(cfg, prompts, inputs.agent))
    reward_functions = load_reward_functions(cfg.rewards.functions, cfg.base_dir, cfg.run.device)
    policy = inputs.policy or build_policy(cfg, tokenizer)
    tiled_mlp = _place_memory(cfg, dist, policy, admission)
    dataset = prompts.train
    sampler, trainer_state = prompt_order(cfg, dist, dataset)
    critic = build_critic(cfg, policy, dist) if cfg.ppo else None  # PPO's value function
    model = policy.model
    if dist.enabled:  # DDP / FSDP2; a LoRA critic's adapter is synchronised by the critic itself
        model = launch.wrap_model(model, cfg, dist, critic.ddp_ignored(model) if critic else ())
    if critic is not None:
        critic.attach(model, cfg.distributed.strategy)
    optimizer = build_optimizer(trainable_parameters(policy, critic), cfg, policy.device)
    scheduler = build_scheduler(optimizer, cfg)
    generator = torch.Generator(device=policy.device).manual_seed(cfg.run.seed + 7919 * dist.rank)
    spec = admission.spec
    engine = build_engine(cfg, dist, policy, model, spec, model_path)
    undo.callback(engine.close)  # vLLM: its weights and KV pool
    agent_inputs = AgentInputs(inputs.tools, inputs.environment_factory, inputs.rollout_func)
    setup = setup_agent(cfg, dist, engine, policy.tokenizer, agent_inputs)  # tools / environments / rollout_func
    agent = setup.agent
    if dist.enabled and isinstance(agent, AgentRollout):  # multi-turn: wrapped like the engine
        agent = launch.wrap_engine(agent, model, cfg, dist)
    extra = setup.rewards
    reward_runner = RewardRunner(
        reward_functions + extra,
        None if cfg.rewards.reward_weights is None else [*cfg.rewards.reward_weights, *[1.0] * len(extra)],
        on_error=cfg.rewards.on_error, timeout_s=cfg.rewards.timeout_s, isolation=cfg.rewards.isolation,
        max_failed_steps=cfg.rewards.max_failed_steps,
    )
    sampling = sampling_params(cfg, policy)
    # The update stage (update/): old / reference log-probs, the loss, the optimizer steps
    settings = UpdateSettings.of(cfg, policy.model, spec)  # the admission's resolved spec
    updater = Updater(cfg, policy, model, optimizer, scheduler, dist, critic, settings)
    # a collapsed policy stops the run (exit 3); run.stop_on_stall stops at a stall (exit 5)
    watch = RunWatch(cfg, dist, checkpoints.output_dir, policy.model)
    for warning in loss_warnings(cfg) if dist.is_main else []:
        log.warning(warning)
    made = dict(cfg=cfg, dist=dist, output_dir=checkpoints.output_dir, checkpoints=checkpoints, policy=policy,
                dataset=dataset, sampler=sampler, trainer_state=trainer_state, critic=critic, model=model,
                optimizer=optimizer, scheduler=scheduler, generator=generator, engine=engine, agent=agent,
                rollout_func=setup.rollout_func, reward_runner=reward_runner, sampling=sampling, updater=updater,
                watch=watch, stop=inputs.stop or StopRequest(), tiled_mlp=tiled_mlp, thread_info=thread_info,
                spec=spec)
    plan = checkpoints.plan_folder()  # resume, fresh, refuse, or already finished: before writing
    if plan.finished is not None:  # nothing to train, nothing written
        return RunParts(**made, writer=MetricsWriter(checkpoints.output_dir, enabled=False), evaluator=None,
                        start_step=0)
    writer = _open_writer(cfg, dist, checkpoints.output_dir, thread_info)
    evaluator = make_evaluator(cfg, dist, policy, reward_runner, engine, agent, sampling,  # eval.data, or None
                               prompts.eval)
    checkpoints.attach(CheckpointParts(policy, optimizer, scheduler, sampler, generator, updater, watch, writer,
                                       critic))
    return RunParts(**made, writer=writer, evaluator=evaluator, start_step=checkpoints.resume())


def _place_memory(cfg: Config, dist: DistContext, policy: Policy, admission: Admission) -> bool:
    """The admission's runtime memory tricks on the loaded policy: the tiled MLP and the pinned-memory cap of
    offloaded checkpoints. Returns whether the MLPs run tiled."""
    tiled = apply_tiled_mlp(policy.model, admission, show=dist.is_main, distributed=dist.enabled)
    if admission.planned and cfg.memory.offload_activations and policy.device.type == "cuda":
        from slimgrpo.memory.pinned import set_activation_cap

        # pinned host memory for offloaded activations: at most the plan's host line (memory/pinned.py)
        set_activation_cap(policy.device, admission.offload_cap_bytes)
    return tiled


def apply_tiled_mlp(model: torch.nn.Module, admission: Admission, show: bool = True, distributed: bool = False,
                    console: Console | None = None) -> bool:
    """Tile the decoder MLPs (``memory/tiled_mlp.py``) where the admission's spec says so: all or none, as the plan
    counts them. When one cannot be tiled (a class the tiler does not know, dropout inside it, DDP / FSDP2, whose
    gradient hooks do not expect a parameter's gradient in several pieces) none is, and the run goes on untiled
    or stops as the admission decided (``Admission.if_untiled``: exit 4 where untiled is over memory.budget)."""
    if admission.spec.tiled_mlp != "on":
        return False
    if distributed:
        reasons = ["an MLP under distributed training (not supported yet)"]
    else:
        report = tile_mlps(model)
        if report.complete:
            return True
        untile_mlps(model)
        reasons = report.unknown
    cannot = f"memory.tiled_mlp={tiled_mlp_setting(admission.cfg)}: cannot tile {'; '.join(reasons)}"
    if admission.untiled_refused:
        raise MemoryBudgetError(cannot + admission.if_untiled)
    if show:
        (console or Console()).print(cannot + admission.if_untiled, soft_wrap=True)
    return False


def build_engine(cfg: Config, dist: DistContext, policy: Policy, model: torch.nn.Module, spec: RunSpec,
                 model_path: str):
    """The rollout engine: colocated vLLM (rollout/vllm_engine.py) or the built-in one over the live weights;
    under torchrun wrapped by ``distributed/wrap.py`` (FSDP2: generation gathers the sharded weights; DDP: a
    failure stops every rank)."""
    if resolve_engine(cfg.rollout.engine, cfg.run.device) == "vllm":
        from slimgrpo.rollout.vllm_engine import VllmRolloutEngine, VllmSettings

        engine = VllmRolloutEngine(policy.model, VllmSettings.from_config(cfg, model_path, policy.model))
    else:
        engine = TorchRolloutEngine(policy.model, max_batch_rows=cfg.rollout.max_batch_rows,
                                    kv_cache_dtype=cfg.rollout.kv_cache_dtype,
                                    pack_weights=spec.decode_packing,  # the plan's choice (plan.model.resolve)
                                    agree_over=launch.generation_agreement(cfg, dist))
    if dist.enabled:
        engine = launch.wrap_engine(engine, model, cfg, dist)
    return engine


def sampling_params(cfg: Config, policy: Policy) -> SamplingParams:
    """``rollout.*``'s sampling settings, with every EOS id the tokenizer and the model's generation config name."""
    tok = policy.tokenizer
    eos = {tok.eos_token_id} | set(generation_eos_ids(policy.model))
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_completion_length, min_new_tokens=r.min_completion_length,
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
        repetition_penalty=r.repetition_penalty,
        eos_token_ids=tuple(sorted(eos)), pad_token_id=tok.pad_token_id,
    )


def _open_writer(cfg: Config, dist: DistContext, output_dir: Path, thread_info) -> MetricsWriter:
    """metrics.jsonl and the metric sinks (``log.report_to``: one run per job, on rank 0), config.yaml and the
    threads record: the first things a run writes into its folder."""
    backends = []
    if dist.is_main:  # one run per job in wandb / mlflow, not one per rank
        from slimgrpo.output.backends import make_backends

        backends = make_backends(cfg.log.report_to, output_dir, cfg.to_dict())
    writer = MetricsWriter(output_dir, enabled=dist.is_main, backends=backends)
    if dist.is_main:
        dump_config(cfg, output_dir / "config.yaml")
        threads.record(output_dir, thread_info)
    return writer
