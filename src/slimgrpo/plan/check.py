"""The plan a run is checked against before any weights load: config to planner inputs, the budget, and
the refusal (or the applied fit) when the plan does not fit. Library code; ``commands/plan.py`` is the
``slimgrpo plan`` command on top of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console

from slimgrpo.config import Config, ConfigError, auto_token_chunk, from_dict, merge_overrides, resolve_path
from slimgrpo.config.sections.loss import takes_fused_path
from slimgrpo.config.sections.rollout import resolve_engine
from slimgrpo.plan.advice import Suggestion, fit_to_budget, format_gib, parse_bytes, render_plan
from slimgrpo.plan.planner import MemoryPlan, PlanInputs, plan_memory
from slimgrpo.plan.shapes import ModelShape, load_shape

# PlanInputs field -> config key, for turning the planner's advice into overrides.
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


def plan_device(cfg: Config, override: str | None = None) -> str:
    if override:
        return override
    if cfg.run.device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if cfg.run.device.startswith("cuda") else "cpu"


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # model.dtype / rollout.vllm_dtype -> bytes per weight


def plan_inputs(cfg: Config, device: str, world_size: int = 1, vocab: int = 152_064,
                prompt_tokens: int | None = None) -> PlanInputs:
    """What the planner needs, read off the config (per process under torchrun). ``prompt_tokens``: the
    longest tokenized prompt of the run's data (``train/prompts.py``), which the plan counts every prompt at
    (at most ``data.max_prompt_length``); None: the bound itself."""
    dtype_bytes = DTYPE_BYTES.get(cfg.model.dtype, 2 if device == "cuda" else 4)
    prompts = max(cfg.prompts_per_step // max(world_size, 1), 1)
    rows = prompts * cfg.rollout.num_generations
    targets = cfg.lora.target_modules
    return PlanInputs(
        device=device, param_dtype_bytes=dtype_bytes, lora=cfg.lora.enabled, lora_rank=cfg.lora.r,
        lora_target_modules=(targets,) if isinstance(targets, str) else tuple(targets),
        load_in_4bit=cfg.model.load_in_4bit, optimizer=cfg.memory.optimizer, bf16_update=cfg.memory.bf16_update,
        num_generations=cfg.rollout.num_generations, prompts_per_step=prompts,
        micro_batch_rows=min(cfg.memory.micro_batch_size or rows, rows),
        max_prompt_length=min(prompt_tokens or cfg.data.max_prompt_length, cfg.data.max_prompt_length),
        max_completion_length=cfg.rollout.max_completion_length,
        beta=cfg.loss.beta, num_iterations=cfg.loss.num_iterations * cfg.loss.steps_per_generation,  # > 1: old log-probs
        ppo=cfg.ppo, kl_coef=cfg.loss.kl_coef,
        gradient_checkpointing=cfg.memory.gradient_checkpointing,
        offload_activations=cfg.memory.offload_activations,
        reference_placement=cfg.memory.reference_placement,
        token_chunk=cfg.loss.token_chunk or auto_token_chunk(vocab),
        vocab_chunk=cfg.loss.vocab_chunk, chunked_loss=True, fused_loss=fused_loss(cfg),
        entropy_bonus=cfg.loss.entropy_bonus,
        generation_batch_rows=cfg.rollout.max_batch_rows,
        attn_implementation=cfg.model.attn_implementation or "sdpa",
        micro_batch_tokens=cfg.memory.micro_batch_tokens,
        share_prompt_forward=cfg.memory.share_prompt_forward,
        kv_cache_dtype=cfg.rollout.kv_cache_dtype,
        tiled_mlp=tiled_mlp_setting(cfg),
        fsdp_shards=world_size if cfg.distributed.strategy == "fsdp" and world_size > 1 else 1,
        ddp=cfg.distributed.strategy == "ddp" and world_size > 1,
        fsdp_generation=cfg.distributed.fsdp_generation,
        **vllm_inputs(cfg, device, dtype_bytes),
    )


def fused_loss(cfg: Config) -> bool:
    """Whether the update's micro-batches take the fused head + loss (``update.micro_loss``'s rule,
    ``config.sections.loss.takes_fused_path``). An adaptive entropy bonus switches path with its coefficient:
    planned fused, whose blocks are at least the separate path's with the bonus."""
    L = cfg.loss
    always_bonus = L.entropy_coef != 0.0 and not L.use_adaptive_entropy
    return takes_fused_path(L.fuse_head_loss, L.top_entropy_quantile, always_bonus, L.importance_sampling_level,
                            cfg.needs_old_logp, L.vocab_chunk)


def vllm_inputs(cfg: Config, device: str, dtype_bytes: int) -> dict[str, Any]:
    """The planner's vLLM fields (plan/vllm.py) from the ``rollout`` section; none when the run uses the
    built-in engine. On CUDA the GPU's memory is read where one is visible (vLLM claims a fraction of it)."""
    r = cfg.rollout
    if resolve_engine(r.engine, device) != "vllm":
        return {}
    total = None
    if device == "cuda":
        index = cuda_index(cfg.run.device)
        if index is not None:
            import torch

            total = int(torch.cuda.mem_get_info(index)[1])
    return {"rollout_engine": "vllm", "vllm_sleep": r.vllm_sleep_mode,
            "vllm_weight_bytes": DTYPE_BYTES.get(r.vllm_dtype, dtype_bytes),
            "vllm_kv_cache_bytes": int(r.vllm_kv_cache_gb * 2**30) if r.vllm_kv_cache_gb is not None else None,
            "vllm_gpu_memory_utilization": r.vllm_gpu_memory_utilization, "gpu_total_bytes": total,
            "vllm_context": cfg.data.max_prompt_length + r.max_completion_length}


def tiled_mlp_setting(cfg: Config) -> str:
    """``memory.tiled_mlp`` as ``auto`` / ``on`` / ``off`` (YAML reads a bare on / off as true / false)."""
    value = cfg.memory.tiled_mlp
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


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


def cuda_index(run_device: str) -> int | None:
    """The GPU a run uses: N of ``run.device=cuda:N``, else the current device (under torchrun the rank's
    own, set from LOCAL_RANK before any plan); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    if run_device.startswith("cuda:"):
        return int(run_device.split(":", 1)[1])
    return torch.cuda.current_device()


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


class MemoryBudgetError(ConfigError):
    """The run's memory plan exceeds ``memory.budget``: exit code 4 (``slimgrpo.exit_codes``), not 2."""

    exit_code = 4


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
    (the plan is one rank's) and the data's longest prompt (``plan_inputs``' ``prompt_tokens``; None: the
    bound data.max_prompt_length)."""

    shape: ModelShape
    device: str
    world_size: int = 1
    prompt_tokens: int | None = None

    def inputs(self, cfg: Config) -> PlanInputs:
        return plan_inputs(cfg, self.device, self.world_size, self.shape.vocab, self.prompt_tokens)

    def plan(self, cfg: Config) -> MemoryPlan:
        return plan_memory(self.shape, self.inputs(cfg))

    def trace(self, cfg: Config, trace_step):
        """``trace_step`` (``trace/step.py``) of ``cfg`` at this scope's device and prompt length."""
        return trace_step(cfg, self.shape, self.device, prompt_tokens=self.prompt_tokens)


def settle_reference_placement(cfg: Config, scope: PlanScope) -> Config:
    """``memory.reference_placement=auto`` on a CUDA full fine-tune with a reference: ``device`` when the plan
    with the copy on the GPU fits ``memory.budget`` (or, with none, the GPU's whole memory), else ``stream``;
    returned in the config, which the run builds its policy from (``modeling.reference_placement``)."""
    import dataclasses

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


def check_before_training(cfg: Config, world_size: int = 1, console: Console | None = None,
                          show: bool = True, trace_fn=None,
                          prompt_tokens: int | None = None) -> tuple[Config, MemoryPlan | None]:
    """Plan the run before any weights load. With ``memory.budget``: refuse a run that cannot fit
    (with the changes that would make it fit), or apply them when ``memory.fit`` is true.
    ``trace_fn(cfg, shape, device) -> Trace`` (``train.trace.trace_step``, which the trainer passes) checks
    the fit by tracing with ``memory.fit=trace``; the planner does not import the trainer's code itself.
    ``prompt_tokens``: the data's longest prompt (``plan_inputs``), None to plan at data.max_prompt_length."""
    console = console or Console()
    device = plan_device(cfg)
    try:
        shape = shape_of(cfg)
    except ConfigError:
        if cfg.memory.budget:
            raise
        return cfg, None  # an architecture the planner does not model: train without a plan
    scope = PlanScope(shape, device, world_size, prompt_tokens)
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
        if trace_fn is None:
            raise ConfigError("memory.fit=trace needs the tracer: pass "
                              "trace_fn=slimgrpo.trace.step.trace_step (the Trainer does)")
        return fit_by_trace(cfg, scope, budget, console, trace_fn, show)
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


def smallest_plan_found(plan: MemoryPlan, suggestions: list[Suggestion]) -> str:
    """The smallest plan the fit reached and the settings that reach it, for a budget nothing fits."""
    if not suggestions:
        return f"the smallest plan found is the config as given, {format_gib(plan.peak_bytes)} GiB"
    return (f"the smallest plan found is {format_gib(suggestions[-1].plan_after.peak_bytes)} GiB with "
            f"{' '.join(overrides_for(all_changes(suggestions))) or 'changes that have no config key'}")


def fitted_config(cfg: Config, scope: PlanScope, budget: int, console: Console, trace_fn=None,
                  show: bool = False) -> tuple[Config, list[str]]:
    """The config ``slimgrpo train`` runs under ``memory.fit`` for ``budget`` on the scope's device, and the
    overrides it applies (empty when it runs the config as written: no fit asked, or the plan fits).
    ``memory.fit=trace`` needs ``trace_fn`` (as :func:`check_before_training`). Raises MemoryBudgetError where train would refuse.
    ``slimgrpo plan`` plans and traces what this returns, so that it shows the run train will run."""
    if not cfg.memory.fit:
        return cfg, []
    if cfg.memory.fit == "trace":
        if trace_fn is None:
            raise ConfigError("memory.fit=trace needs the tracer (trace_fn)")
        tried, _ = fit_by_trace(cfg, scope, budget, console, trace_fn, show)
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


def fit_by_trace(cfg: Config, scope: PlanScope, budget: int, console: Console, trace_step,
                 show: bool = True) -> tuple[Config, MemoryPlan]:
    """``memory.fit=trace``: the planner's fit, checked by a trace (``trace_step``: ``trace/step.py``).
    While the traced device peak is over ``budget``, fit the plan again to a budget smaller by the overshoot."""
    target, tried, host_budget = budget, cfg, host_budget_bytes(cfg, scope.device, strict=False)  # train checked it
    for _ in range(FIT_BY_TRACE_ROUNDS):
        _, suggestions, fits = fit_to_budget(scope.shape, scope.inputs(cfg), target, host_budget)
        if not fits:
            break
        fix = overrides_for(all_changes(suggestions))
        tried = from_dict(merge_overrides(cfg.to_dict(), fix), base_dir=cfg.base_dir,
                           origins=cfg.path_origins) if fix else cfg
        traced = scope.trace(tried, trace_step).device_peak_bytes
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


def apply_tiled_mlp(cfg: Config, model, plan: MemoryPlan | None, console: Console | None = None,
                    show: bool = True, distributed: bool = False) -> bool:
    """Tile the policy's decoder MLPs (``memory/tiled_mlp.py``) when ``memory.tiled_mlp`` and the plan say so;
    returns whether they run tiled. ``plan``: the run's plan (``check_before_training``), None for an
    architecture the planner does not model (then only ``on`` tiles). All or nothing, as the plan counts it:
    when an MLP cannot be tiled (a class the tiler does not know, dropout inside it) none is, and the run
    goes on untiled only if the plan without tiling fits ``memory.budget``; else ``MemoryBudgetError``
    (exit 4) with both numbers. ``distributed`` (DDP / FSDP): not tiled, the same way (each shard's backward
    would hand a parameter its gradient more than once, which their gradient hooks do not expect)."""
    import dataclasses

    from slimgrpo.plan.planner import tiled_mlp_on
    from slimgrpo.memory.tiled_mlp import tile_mlps, untile_mlps

    setting = tiled_mlp_setting(cfg)
    if setting == "off" or not (tiled_mlp_on(plan.shape, plan.inputs) if plan is not None else setting == "on"):
        return False
    if distributed:
        reasons = ["an MLP under distributed training (not supported yet)"]
    else:
        report = tile_mlps(model)
        if report.complete:
            return True
        untile_mlps(model)
        reasons = report.unknown
    console = console or Console()
    cannot = f"memory.tiled_mlp={setting}: cannot tile {'; '.join(reasons)}"
    if plan is None:
        if show:
            console.print(f"{cannot}; the run goes on untiled (no plan for this architecture)", soft_wrap=True)
        return False
    untiled = plan_memory(plan.shape, dataclasses.replace(plan.inputs, tiled_mlp="off"))
    if cfg.memory.budget:
        budget = budget_bytes(cfg.memory.budget, plan.inputs.device, cfg.run.device)
        if untiled.peak_bytes > budget:
            raise MemoryBudgetError(
                f"{cannot}. Untiled, the run needs about {format_gib(untiled.peak_bytes)} GiB at its peak "
                f"({untiled.peak_phase}), more than memory.budget={cfg.memory.budget} ({format_gib(budget)} GiB); "
                f"tiled the plan was {format_gib(plan.peak_bytes)} GiB. Use shorter sequences, smaller "
                "micro-batches or more memory (slimgrpo plan CONFIG memory.tiled_mlp=off shows the untiled plan)")
        fits = f", which fits memory.budget={cfg.memory.budget} ({format_gib(budget)} GiB)"
    else:
        fits = ""
    if show:
        console.print(f"{cannot}; the run goes on untiled: the plan without tiling peaks at "
                      f"{format_gib(untiled.peak_bytes)} GiB{fits}", soft_wrap=True)
    return False
