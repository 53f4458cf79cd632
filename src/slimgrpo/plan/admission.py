"""The admission of a run, before any weights load: its plan against ``memory.budget`` (and ``memory.host_budget``),
the refusal, or the fit applied (``memory.fit``: the planner's changes, or with ``trace`` the changes checked by
the trace), and what the config leaves to the plan decided for the run:

    admission = admit(cfg, world_size=1, prompt_tokens=153)    # prints the plan's headline (or table)
    admission.cfg, admission.spec, admission.plan              # the config it runs, the resolved spec

Called from above the run's build (``train/trainer.py``), which reads the verdict (``runspec.run.Admission``) and
applies it: the spec's ``decode_packing`` and ``tiled_mlp``, the pinned-memory cap of offloaded checkpoints, what
happens when the MLPs cannot be tiled. ``commands/plan.py`` is the ``slimgrpo plan`` command over the same
functions."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console

from slimgrpo.config import Config, ConfigError, from_dict, merge_overrides, resolve_path
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.plan.model import plan_memory, resolve
from slimgrpo.plan.render import render_plan
from slimgrpo.plan.search import Suggestion, fit_to_budget
from slimgrpo.plan.types import MemoryPlan
from slimgrpo.runspec.run import Admission, RunSpec, cuda_index, run_spec, spec_device, tiled_mlp_setting
from slimgrpo.runspec.shape import ModelShape, load_shape
from slimgrpo.trace.step import TraceResult, trace_step
from slimgrpo.units import format_gib, parse_bytes

# RunSpec field -> config key, for turning the planner's advice into overrides.
CONFIG_KEY = {
    "lora": "lora.enabled",
    "lora_rank": "lora.r",
    "load_in_4bit": "model.load_in_4bit",
    "optimizer": "memory.optimizer",
    "bf16_update": "memory.bf16_update",
    "micro_batch_rows": "memory.micro_batch_size",
    "micro_batch_tokens": "memory.micro_batch_tokens",
    "gradient_checkpointing": "memory.gradient_checkpointing",
    "offload_activations": "memory.offload_activations",
    "token_chunk": "loss.token_chunk",
    "vocab_chunk": "loss.vocab_chunk",
    "generation_batch_rows": "rollout.max_batch_rows",
    "max_completion_length": "rollout.max_completion_length",
    "num_generations": "rollout.num_generations",
    "tiled_mlp": "memory.tiled_mlp",
}


def overrides_for(changes: dict[str, Any]) -> list[str]:
    out = []
    for field, value in changes.items():
        key = CONFIG_KEY.get(field)
        if key is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif value is None:
            value = "null"
        out.append(f"{key}={value}")
    return out


def budget_bytes(spec: str, device: str, run_device: str = "auto") -> int:
    """``16GiB`` etc., or ``auto``: free memory of the run's GPU (``run_device``: ``run.device``, so
    ``cuda:1`` reads GPU 1, not the current one) or MemAvailable (CPU)."""
    if spec != "auto":
        return parse_bytes(spec)
    if device == "cuda":
        import torch

        index = cuda_index(run_device)
        if index is None:
            raise ConfigError("memory.budget=auto on cuda, but no CUDA device is visible: give a size")
        return int(torch.cuda.mem_get_info(index)[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ConfigError("memory.budget=auto: cannot read available memory here; give a size such as 16GiB")


def host_budget_bytes(cfg: Config, device: str, strict: bool = True) -> int | None:
    """Host RAM a CUDA run may hold off the device (``memory.host_budget``): a size, ``auto`` = the
    machine's MemAvailable, None when not checked (null, or a CPU run, where host memory is the device).
    ``strict``: a size above this machine's RAM is refused, naming the key (``slimgrpo plan`` passes False:
    it may plan for another machine, and says so instead)."""
    spec = cfg.memory.host_budget
    if device != "cuda" or spec is None:
        return None
    if spec == "auto":
        try:
            return budget_bytes("auto", "cpu")
        except (ConfigError, OSError):
            return None  # cannot read it here: not checked
    try:
        value = parse_bytes(spec)
    except ValueError as e:
        raise ConfigError(f"memory.host_budget={spec!r}: {e}") from None
    total = machine_ram_bytes()
    if strict and total is not None and value > total:
        raise ConfigError(f"memory.host_budget={spec} ({format_gib(value)} GiB) is more than this machine's RAM "
                          f"({format_gib(total)} GiB): give at most that, or auto (the available memory)")
    return value


def machine_ram_bytes() -> int | None:
    """MemTotal of /proc/meminfo, or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(cfg: Config, plan: MemoryPlan, host_budget: int | None) -> None:
    """Refuse a CUDA run whose plan parks more in host RAM than ``host_budget`` (before it starts, rather
    than the OOM killer halfway), naming both numbers and what holds the host memory."""
    if host_budget is None or plan.host_bytes <= host_budget:
        return
    lines = ", ".join(f"{c.name} {format_gib(c.bytes)} GiB" for c in plan.components
                      if c.location == "host" and c.bytes)
    where = ("the machine's available memory (memory.host_budget=auto)" if cfg.memory.host_budget == "auto"
             else f"memory.host_budget={cfg.memory.host_budget}")
    raise MemoryBudgetError(
        f"the run would hold {format_gib(plan.host_bytes)} GiB in host RAM ({lines}), more than the "
        f"{format_gib(host_budget)} GiB of {where}: turn memory.offload_activations off, use smaller "
        "micro-batches (memory.micro_batch_size) or LoRA, or run where more host memory is free")


def shape_of(cfg: Config, spec: str | None = None) -> ModelShape:
    target = spec or resolve_path(cfg, cfg.model.path)
    try:
        return load_shape(target)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def all_changes(suggestions: list[Suggestion]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for s in suggestions:
        merged.update(s.change)
    return merged


def prompt_source(cfg: Config, prompt_tokens: int | None) -> str:
    """A few words on where the plan's prompt length came from, for its headline."""
    bound = cfg.data.max_prompt_length
    if prompt_tokens is None or prompt_tokens >= bound:
        return f"prompts counted at data.max_prompt_length={bound}"
    where = "data.path and eval.data" if cfg.eval.data else "data.path"
    return f"prompts counted at {prompt_tokens} tokens, the longest in {where} (data.max_prompt_length={bound})"


def not_modelled(cfg: Config, plan: MemoryPlan) -> list[str]:
    """What the plan leaves out where it can be far off, in a few words each, for its headline: packed
    update rows (a run with short prompts or completions peaks far lower: the addition recipe's plan says
    6.21 GiB for a measured 2.98 GiB peak)."""
    out = []
    x = plan.inputs
    packable = (cfg.memory.share_prompt_forward and not cfg.memory.gradient_checkpointing
                and (cfg.model.attn_implementation or "sdpa") in ("sdpa", "eager")
                and plan.shape.family in ("llama", "qwen2", "qwen3", "mistral"))
    if packable and plan.peak_phase == "update":
        out.append(f"an upper bound: every prompt counted at {x.max_prompt_length} tokens, every completion at "
                   f"{x.max_completion_length}, packed update rows (real tokens only) not modelled: shorter prompts "
                   "or completions peak lower, docs/memory.md 'Packed rows'")
    return out


@dataclasses.dataclass(frozen=True)
class PlanScope:
    """What a config is planned for besides itself: the model's shape, the device, the processes of the job
    (the plan is one rank's) and the data's longest prompt (``run_spec``'s ``prompt_tokens``; None: the
    bound data.max_prompt_length)."""

    shape: ModelShape
    device: str
    world_size: int = 1
    prompt_tokens: int | None = None

    def inputs(self, cfg: Config) -> RunSpec:
        return run_spec(cfg, self.device, self.world_size, self.shape.vocab, self.prompt_tokens)

    def plan(self, cfg: Config) -> MemoryPlan:
        return plan_memory(self.shape, self.inputs(cfg))

    def trace(self, cfg: Config):
        """The trace of ``cfg``'s step at this scope's device and prompt length (``trace_config``)."""
        return trace_config(cfg, self.shape, self.device, prompt_tokens=self.prompt_tokens)


def trace_config(cfg: Config, shape: ModelShape, device: str = "cpu", prompt_tokens: int | None = None,
                 generation: bool = True, decode_steps: int = 2) -> TraceResult:
    """The trace of one step of ``cfg`` for a model of ``shape`` on ``device`` (``trace/step.py``), its spec resolved
    as a run resolves it (``model.resolve``: the tiled MLP, the decode packing). ``prompt_tokens``: the data's
    longest prompt, which the traced prompts take (at most data.max_prompt_length); None: data.max_prompt_length."""
    if prompt_tokens is not None and prompt_tokens < cfg.data.max_prompt_length:  # the trace's own copy
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_prompt_length=prompt_tokens))
    spec = resolve(shape, run_spec(cfg, device, vocab=shape.vocab))
    return trace_step(cfg, shape, spec, generation=generation, decode_steps=decode_steps)


def settle_reference_placement(cfg: Config, scope: PlanScope) -> Config:
    """``memory.reference_placement=auto`` on a CUDA full fine-tune with a reference: ``device`` when the plan
    with the copy on the GPU fits ``memory.budget`` (or, with none, the GPU's whole memory), else ``stream``;
    returned in the config, which the run builds its policy from (``modeling.reference_placement``)."""
    device = scope.device
    if device != "cuda" or cfg.lora.enabled or not cfg.needs_reference or \
            cfg.memory.reference_placement != "auto":
        return cfg
    on_device = dataclasses.replace(scope.inputs(cfg), reference_placement="device")
    if cfg.memory.budget:
        budget = budget_bytes(cfg.memory.budget, device, cfg.run.device)
    else:
        import torch

        index = cuda_index(cfg.run.device)
        budget = int(torch.cuda.mem_get_info(index)[1]) if index is not None else 0
    placement = "device" if plan_memory(scope.shape, on_device).peak_bytes <= budget else "stream"
    return dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, reference_placement=placement))


def admit(cfg: Config, world_size: int = 1, console: Console | None = None, show: bool = True,
          prompt_tokens: int | None = None, shape: ModelShape | None = None) -> Admission:
    """The run's admission before any weights load (module docstring): its plan, printed where ``show``; with
    ``memory.budget`` a run that cannot fit is refused (``MemoryBudgetError``, with the changes that would make
    it fit) or, with ``memory.fit``, fitted. ``world_size``: the processes of the job (the plan is one rank's);
    ``prompt_tokens``: the data's longest prompt (``run_spec``), None to plan at data.max_prompt_length;
    ``shape``: the model's, when the caller has read it (a model object it loaded), else read from
    ``model.path``."""
    console = console or Console()
    try:
        shape = shape or shape_of(cfg)
    except ConfigError:
        if cfg.memory.budget:
            raise
        return Admission.unplanned(cfg, world_size, prompt_tokens)  # an architecture the planner does not model
    scope = PlanScope(shape, spec_device(cfg), world_size, prompt_tokens)
    cfg, plan = _planned(cfg, scope, console, show)
    return admission_of(cfg, plan)


def _planned(cfg: Config, scope: PlanScope, console: Console, show: bool) -> tuple[Config, MemoryPlan]:
    """The config the run trains (fitted where ``memory.fit`` asks) and its plan; refuses a run over the budget."""
    shape, device, prompt_tokens = scope.shape, scope.device, scope.prompt_tokens
    cfg = settle_reference_placement(cfg, scope)
    plan = scope.plan(cfg)
    host_budget = host_budget_bytes(cfg, device)
    if not cfg.memory.budget:
        check_host_memory(cfg, plan, host_budget)
        if show:
            caveat = "; ".join([prompt_source(cfg, prompt_tokens), *not_modelled(cfg, plan)])
            console.print(f"memory plan: peak {format_gib(plan.peak_bytes)} GiB during {plan.peak_phase} "
                          f"({caveat}; slimgrpo plan CONFIG for the breakdown)", soft_wrap=True)
        return cfg, plan
    budget = budget_bytes(cfg.memory.budget, device, cfg.run.device)
    if cfg.memory.fit == "trace":
        return fit_by_trace(cfg, scope, budget, console, show)
    if plan.peak_bytes <= budget:
        check_host_memory(cfg, plan, host_budget)
        if show:
            render_plan(plan, console, budget)
        return cfg, plan
    _, suggestions, fits = fit_to_budget(shape, plan.inputs, budget, host_budget)
    fix = overrides_for(all_changes(suggestions))
    if cfg.memory.fit and fits:
        new_cfg = from_dict(merge_overrides(cfg.to_dict(), fix), base_dir=cfg.base_dir,
                           origins=cfg.path_origins)
        console.print(f"memory.fit: applying {' '.join(fix)} to fit {format_gib(budget)} GiB")
        new_plan = scope.plan(new_cfg)
        check_host_memory(new_cfg, new_plan, host_budget)
        if show:
            render_plan(new_plan, console, budget)
        return new_cfg, new_plan
    if show:
        render_plan(plan, console, budget)
    advice = (f"these changes bring it to {format_gib(suggestions[-1].plan_after.peak_bytes)} GiB: {' '.join(fix)} "
              "(or set memory.fit=true to apply them)") if fits else \
        f"no combination of the planner's changes fits: {smallest_plan_found(plan, suggestions)}; use a smaller " \
        "model, shorter completions or more memory"
    raise MemoryBudgetError(f"the run needs about {format_gib(plan.peak_bytes)} GiB at its peak ({plan.peak_phase}), "
                            f"more than memory.budget={cfg.memory.budget} ({format_gib(budget)} GiB); {advice}")


def admission_of(cfg: Config, plan: MemoryPlan) -> Admission:
    """The verdict a build applies for ``cfg`` and its ``plan``: the resolved spec, the offload cap, what happens to
    untileable MLPs."""
    spec = resolve(plan.shape, plan.inputs)
    offload_cap = None
    if cfg.memory.offload_activations and spec.device == "cuda":
        offload_cap = plan.bytes_of("offloaded checkpoints") or None
    if_untiled, refused = _if_untiled(cfg, plan) if spec.tiled_mlp == "on" else ("", False)
    return Admission(cfg, spec, planned=True, offload_cap_bytes=offload_cap, if_untiled=if_untiled,
                     untiled_refused=refused, plan=plan)


def _if_untiled(cfg: Config, plan: MemoryPlan) -> tuple[str, bool]:
    """What happens when the MLPs the plan tiles cannot be tiled (a class the tiler does not know, dropout inside
    it, distributed training): the run goes on untiled only if the plan without tiling fits ``memory.budget``
    (all MLPs or none, as the plan counts them). Returns the words said after the reason, and whether they
    refuse the run."""
    untiled = plan_memory(plan.shape, dataclasses.replace(plan.inputs, tiled_mlp="off"))
    if cfg.memory.budget:
        budget = budget_bytes(cfg.memory.budget, plan.inputs.device, cfg.run.device)
        if untiled.peak_bytes > budget:
            return (f". Untiled, the run needs about {format_gib(untiled.peak_bytes)} GiB at its peak "
                    f"({untiled.peak_phase}), more than memory.budget={cfg.memory.budget} ({format_gib(budget)} GiB); "
                    f"tiled the plan was {format_gib(plan.peak_bytes)} GiB. Use shorter sequences, smaller "
                    "micro-batches or more memory (slimgrpo plan CONFIG memory.tiled_mlp=off shows the untiled plan)",
                    True)
        fits = f", which fits memory.budget={cfg.memory.budget} ({format_gib(budget)} GiB)"
    else:
        fits = ""
    return (f"; the run goes on untiled: the plan without tiling peaks at {format_gib(untiled.peak_bytes)} GiB{fits}",
            False)


def smallest_plan_found(plan: MemoryPlan, suggestions: list[Suggestion]) -> str:
    """The smallest plan the fit reached and the settings that reach it, for a budget nothing fits."""
    if not suggestions:
        return f"the smallest plan found is the config as given, {format_gib(plan.peak_bytes)} GiB"
    return (f"the smallest plan found is {format_gib(suggestions[-1].plan_after.peak_bytes)} GiB with "
            f"{' '.join(overrides_for(all_changes(suggestions))) or 'changes that have no config key'}")


def fitted_config(cfg: Config, scope: PlanScope, budget: int, console: Console,
                  show: bool = False) -> tuple[Config, list[str]]:
    """The config ``slimgrpo train`` runs under ``memory.fit`` for ``budget`` on the scope's device, and the
    overrides it applies (empty when it runs the config as written: no fit asked, or the plan fits).
    Raises MemoryBudgetError where train would refuse.
    ``slimgrpo plan`` plans and traces what this returns, so that it shows the run train will run."""
    if not cfg.memory.fit:
        return cfg, []
    if cfg.memory.fit == "trace":
        tried, _ = fit_by_trace(cfg, scope, budget, console, show)
        before, after = scope.inputs(cfg), scope.inputs(tried)
        changed = {f.name: getattr(after, f.name) for f in dataclasses.fields(after)
                   if getattr(after, f.name) != getattr(before, f.name)}
        return tried, overrides_for(changed)
    plan = scope.plan(cfg)
    if plan.peak_bytes <= budget:
        return cfg, []
    host_budget = host_budget_bytes(cfg, scope.device, strict=False)
    _, suggestions, fits = fit_to_budget(scope.shape, plan.inputs, budget, host_budget)
    if not fits:
        raise MemoryBudgetError(f"memory.fit: no combination of the planner's changes fits {format_gib(budget)} GiB: "
                                f"{smallest_plan_found(plan, suggestions)}")
    fix = overrides_for(all_changes(suggestions))
    return from_dict(merge_overrides(cfg.to_dict(), fix), base_dir=cfg.base_dir, origins=cfg.path_origins), fix


FIT_BY_TRACE_ROUNDS = 4  # traces memory.fit=trace may run before it gives up


def fit_by_trace(cfg: Config, scope: PlanScope, budget: int, console: Console,
                 show: bool = True) -> tuple[Config, MemoryPlan]:
    """``memory.fit=trace``: the planner's fit, checked by a trace (``trace_config``).
    While the traced device peak is over ``budget``, fit the plan again to a budget smaller by the overshoot."""
    target, tried, host_budget = budget, cfg, host_budget_bytes(cfg, scope.device, strict=False)  # train checked it
    for _ in range(FIT_BY_TRACE_ROUNDS):
        _, suggestions, fits = fit_to_budget(scope.shape, scope.inputs(cfg), target, host_budget)
        if not fits:
            break
        fix = overrides_for(all_changes(suggestions))
        tried = from_dict(merge_overrides(cfg.to_dict(), fix), base_dir=cfg.base_dir,
                           origins=cfg.path_origins) if fix else cfg
        traced = scope.trace(tried).device_peak_bytes
        if show:
            console.print(f"memory.fit=trace: {' '.join(fix) or 'the config as given'}: traced peak "
                          f"{format_gib(traced)} GiB against {format_gib(budget)} GiB", soft_wrap=True)
        if traced <= budget:
            new_plan = scope.plan(tried)
            check_host_memory(tried, new_plan, host_budget)
            if show:
                render_plan(new_plan, console, budget)
            return tried, new_plan
        target -= traced - budget
        if target <= 0:
            break
    raise MemoryBudgetError(f"memory.fit=trace: no settings the planner proposes trace below memory.budget="
                      f"{cfg.memory.budget} ({format_gib(budget)} GiB); use a smaller model, shorter "
                      "completions or more memory")
