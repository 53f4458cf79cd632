"""``slimgrpo plan``: the memory plan of a config or a model shape, what to change to fit a budget, and
with ``--trace`` one real step traced on fake tensors (``trace/step.py``). The library it stands on is
``plan/`` (``admission.py``: the budget, the fit; ``search.py``; ``render.py``) and ``runspec/`` (the run spec)."""

from __future__ import annotations

import os

from rich.console import Console

from slimgrpo.config import ConfigError, check_context_length, from_dict, load_config, merge_overrides
from slimgrpo.config.errors import MemoryBudgetError
from slimgrpo.exit_codes import DOES_NOT_FIT
from slimgrpo.plan.admission import (PlanScope, all_changes, budget_bytes, check_host_memory, fitted_config,
                                     host_budget_bytes, machine_ram_bytes, not_modelled, overrides_for, prompt_source,
                                     shape_of, smallest_plan_found, trace_config)
from slimgrpo.plan.model import plan_memory
from slimgrpo.plan.render import render_plan, render_trace
from slimgrpo.plan.search import blocked_ways, fit_to_budget
from slimgrpo.runspec.run import run_spec, spec_device
from slimgrpo.runspec.shape import preset_shapes
from slimgrpo.units import format_gib, human_count

__all__ = ["plan_command"]


def _nproc(args, cfg) -> int:
    """``--nproc N``: the processes of the torchrun job, checked as the job itself checks them."""
    n = getattr(args, "nproc", 1) or 1
    if n < 1:
        raise ConfigError(f"slimgrpo plan --nproc must be >= 1, got {n}")
    if cfg.prompts_per_step % n:
        raise ConfigError(
            f"--nproc {n}: run.batch_size={cfg.run.batch_size} gives {cfg.prompts_per_step} prompts per step, which "
            f"{n} processes cannot share evenly: use a multiple of {n * cfg.rollout.num_generations} for "
            f"run.batch_size")
    return n


def plan_command(args) -> int:
    """``slimgrpo plan``: exit 0 when the plan fits the budget (or none is given), 4 when it does not
    (``slimgrpo.exit_codes``: the same code as ``slimgrpo train`` refused by ``memory.budget``)."""
    console = Console()
    if args.presets:
        for name, shape in preset_shapes().items():
            console.print(f"{name:16s} {human_count(shape.num_params):>6s} params  vocab {shape.vocab}")
        return 0
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides.insert(0, args.config)
        args.config = None
    if args.config:
        cfg = load_config(args.config, args.overrides, validate=False)
    elif args.model:
        cfg = from_dict(merge_overrides({}, list(args.overrides)))
    else:
        raise ConfigError("slimgrpo plan: give a CONFIG file or --model SHAPE (see slimgrpo plan --help)")
    from slimgrpo.config.paths import check_inputs_exist
    from slimgrpo.config.validate import attention_problem

    if args.config and not args.model:
        check_inputs_exist(cfg, ("model.path",))  # named with its key, the path as written and its folder

    if cfg.model.attn_implementation and attention_problem(cfg):  # the run would stop at validation
        console.print(f"[yellow]warning[/yellow]: {attention_problem(cfg)}; `slimgrpo train` refuses this config")
    device = spec_device(cfg, args.device or ("cuda" if not args.config and cfg.run.device == "auto" else None))
    shape = shape_of(cfg, args.model)
    if getattr(args, "longest", False):  # before the config's own lengths are checked: it asks for others
        return longest_command(args, cfg, shape, device, console)
    # As `slimgrpo train` does before loading weights: a context past the model's position limit (after its
    # rope scaling) is refused, naming the limit, instead of planned.
    check_context_length(cfg, shape.max_positions, args.model or cfg.model.path)
    nproc = _nproc(args, cfg)
    spec = args.budget or cfg.memory.budget
    budget = budget_bytes(spec, device, cfg.run.device) if spec else None
    host_budget = host_budget_bytes(cfg, device, strict=False)
    _host_budget_note(cfg, host_budget, console)
    prompt_tokens = _prompt_tokens(args, cfg, console)
    # memory.fit: plan (and trace) the run `slimgrpo train` runs, not the config as written
    cfg, _ = _fitted(args, cfg, PlanScope(shape, device, nproc, prompt_tokens), budget, console)
    inputs = run_spec(cfg, device, nproc, vocab=shape.vocab, prompt_tokens=prompt_tokens)
    plan = plan_memory(shape, inputs)
    per_rank = "" if nproc == 1 else (f" (one rank of {nproc}, distributed.strategy={cfg.distributed.strategy}"
                                      + (": sharded state / {nproc}".format(nproc=nproc) if inputs.fsdp_shards > 1
                                         else "") + ")")
    console.print(f"[bold]{args.model or cfg.model.path}[/bold]: {human_count(shape.num_params)} parameters, "
                  f"{inputs.rows} completions per step x {inputs.max_completion_length} tokens, on {device}{per_rank}")
    for caveat in [prompt_source(cfg, prompt_tokens), *not_modelled(cfg, plan)] if args.config else []:
        console.print(f"[yellow]note[/yellow]: {caveat}", soft_wrap=True)
    render_plan(plan, console, budget)
    if getattr(args, "trace", False):
        from slimgrpo.output.console import quiet_third_party

        # As train / eval / export: the traced step runs transformers and torchao code whose FutureWarnings
        # (`past_key_values` is deprecated ...) and import-time logs are not the user's to act on.
        quiet_third_party(cfg.log.verbose)
        console.print()
        render_trace(plan, trace_config(cfg, shape, device, prompt_tokens=prompt_tokens), console, budget)
    if host_budget is not None and plan.host_bytes:
        what = ("this machine's available memory; memory.host_budget=SIZE for another"
                if cfg.memory.host_budget == "auto" else f"memory.host_budget={cfg.memory.host_budget}")
        console.print(f"host RAM: the plan holds {format_gib(plan.host_bytes)} GiB, {format_gib(host_budget)} GiB "
                      f"available ({what})", soft_wrap=True)
        try:
            check_host_memory(cfg, plan, host_budget)
        except MemoryBudgetError as e:
            console.print(f"[red]does not fit in host RAM[/red]: {e}", soft_wrap=True)
            return DOES_NOT_FIT
    if budget is None or plan.peak_bytes <= budget:
        return 0
    _, suggestions, fits = fit_to_budget(shape, inputs, budget, host_budget)
    console.print("\n[bold]To fit the budget[/bold], cheapest first:")
    blocked = [f"  - not taken, host RAM: {b.description}: {' '.join(overrides_for(b.change))}"
               for b in blocked_ways(shape, inputs, budget, host_budget, suggestions)]
    for s in suggestions:
        if blocked and "max_completion_length" in s.change:  # every way that keeps the task, first
            console.print("\n".join(blocked), soft_wrap=True)
            blocked = []
        console.print(f"  - {s.description}: {' '.join(overrides_for(s.change)) or '(no config key)'} "
                      f"-> {format_gib(s.plan_after.peak_bytes)} GiB", soft_wrap=True)
    if blocked:
        console.print("\n".join(blocked), soft_wrap=True)
    if fits:
        console.print(f"\nall together: [bold]{' '.join(overrides_for(all_changes(suggestions)))}[/bold]"
                      + ("" if cfg.memory.fit else " (or memory.fit=true)"))
        return DOES_NOT_FIT
    console.print(f"\nno combination fits this budget: {smallest_plan_found(plan, suggestions)}.", soft_wrap=True)
    return DOES_NOT_FIT


def _host_budget_note(cfg, host_budget: int | None, console: Console) -> None:
    """``memory.host_budget`` above this machine's RAM: `train` refuses it here; the plan may be for another
    machine, so it says so and goes on."""
    total = machine_ram_bytes()
    if host_budget is not None and total is not None and host_budget > total and cfg.memory.host_budget != "auto":
        console.print(f"[yellow]note[/yellow]: memory.host_budget={cfg.memory.host_budget} is more than this "
                      f"machine's RAM ({format_gib(total)} GiB): planned as given; `slimgrpo train` refuses it here",
                      soft_wrap=True)


def _prompt_tokens(args, cfg, console: Console) -> int | None:
    """The longest prompt of the config's data, read as `slimgrpo train` reads it (``train/prompts.py``), for
    the plan to count prompts at; None (the plan keeps data.max_prompt_length) with ``--no-data``, for
    ``--model SHAPE`` (another model's tokenizer), for prompts rendered with tools, or when the tokenizer or
    the data cannot be read here (said in a note: the plan may be for another machine)."""
    if args.no_data or args.model or not args.config or not cfg.data.path:
        return None
    from slimgrpo.modeling import tokenizer_folder
    from slimgrpo.output.console import quiet_third_party
    from slimgrpo.train.prompts import data_prompt_tokens

    bound = f"the plan counts every prompt at data.max_prompt_length={cfg.data.max_prompt_length}"
    tokenizer_path = tokenizer_folder(cfg)
    if not os.path.exists(tokenizer_path):  # a hub name: the plan asks no network
        console.print(f"[yellow]note[/yellow]: no tokenizer folder {tokenizer_path!r} here; {bound}", soft_wrap=True)
        return None
    quiet_third_party(cfg.log.verbose)
    try:
        return data_prompt_tokens(cfg)
    except (OSError, ValueError) as e:  # ModelLoadError, DataError (both ValueErrors), an unreadable file
        console.print(f"[yellow]note[/yellow]: could not read the prompts here ({e}); {bound}", soft_wrap=True)
        return None


def _fitted(args, cfg, scope: PlanScope, budget: int | None, console: Console):
    """``(config, overrides)``: with ``memory.fit`` and a budget, the config `slimgrpo train` would run (the
    planner's fit, or ``memory.fit=trace``'s traced one) and the overrides it applies; else the config as is."""
    if not cfg.memory.fit or budget is None:
        return cfg, []
    if cfg.memory.fit == "trace":
        from slimgrpo.output.console import quiet_third_party

        quiet_third_party(cfg.log.verbose)
    try:
        fitted, applied = fitted_config(cfg, scope, budget, console, show=cfg.memory.fit == "trace")
    except MemoryBudgetError as e:
        console.print(f"[red]memory.fit={str(cfg.memory.fit).lower()}[/red]: `slimgrpo train` would refuse this run: {e}",
                      soft_wrap=True)
        return cfg, []
    if applied:
        console.print(f"memory.fit={str(cfg.memory.fit).lower()}: `slimgrpo train` applies [bold]{' '.join(applied)}[/bold] to fit "
                      f"{format_gib(budget)} GiB; "
                      f"{'the plan and trace below are' if getattr(args, 'trace', False) else 'the plan below is'} "
                      "of that run", soft_wrap=True)
    return fitted, applied


# --longest --trace also traces a length this much longer than the answer, when the trace at the answer took
# at most ABOVE_TRACE_MAX_SECONDS (an 8B model at 131K tokens takes minutes per trace on two cores).
ABOVE_FRACTION = 0.05
ABOVE_TRACE_MAX_SECONDS = 90.0


def longest_command(args, cfg, shape, device: str, console: Console) -> int:
    """``slimgrpo plan CONFIG --budget B --longest [--trace]``: the longest prompt-heavy and completion-heavy
    context whose plan, fitted as ``memory.fit`` fits it, is within the budget (``plan/longest.py``); on CUDA
    the plan must also leave the allocator margin the trace adds (``CUDA_TRACE_MARGIN``). ``--trace`` traces
    the answer, and a length ``ABOVE_FRACTION`` longer when the first trace was quick."""
    import time

    from slimgrpo.plan.longest import KINDS, longest_context
    from slimgrpo.trace.step import CUDA_TRACE_MARGIN

    spec = args.budget or cfg.memory.budget
    if not spec:
        raise ConfigError("slimgrpo plan --longest needs a budget: --budget 80GiB (or memory.budget in the config)")
    budget = budget_bytes(spec, device, cfg.run.device)
    inputs = run_spec(cfg, device, vocab=shape.vocab)
    overhead = plan_memory(shape, inputs).framework_bytes
    # The trace's device peak is tensors x (1 + margin) + overhead on CUDA: search against the budget that leaves it.
    margin = CUDA_TRACE_MARGIN if device == "cuda" else 0.0
    target = int((budget - overhead) / (1 + margin)) + overhead if budget > overhead else budget
    host_budget = host_budget_bytes(cfg, device, strict=False)
    limit = (f"position limit {shape.max_positions:,} after rope scaling" if shape.max_positions
             else "no position limit known")
    console.print(f"[bold]{args.model or cfg.model.path}[/bold]: longest context in {format_gib(budget)} GiB on {device}"
                  f" ({limit}; memory.fit's changes applied where needed, never shorter completions"
                  + (f"; {margin:.0%} of the tensor peak left for the CUDA allocator, as the trace adds" if margin else "")
                  + (f"; host RAM {format_gib(host_budget)} GiB" if host_budget is not None else "") + ")",
                  soft_wrap=True)
    found_any = False
    for kind in KINDS:
        found = longest_context(shape, inputs, target, kind, host_budget)
        found_any |= found.fits
        changes = " ".join(overrides_for(found.changes)) or "the config as given"
        if not found.fits:
            part = "prompt" if kind == "prompt-heavy" else "completion"
            console.print(f"  {kind}: [red]nothing fits[/red], not even a 1-token {part} (fitted plan "
                          f"{format_gib(found.plan.peak_bytes)} GiB with {changes})", soft_wrap=True)
            continue
        whole = ", the model's whole window" if found.at_limit else ""
        console.print(f"  {kind}: [bold]prompt {found.prompt:,} + completion {found.completion:,} = "
                      f"{found.tokens:,} tokens[/bold]{whole}; plan {format_gib(found.plan.peak_bytes)} GiB "
                      f"({found.plan.peak_phase}) with {changes}", soft_wrap=True)
        if getattr(args, "trace", False):
            t0 = time.perf_counter()
            _trace_line(cfg, shape, device, budget, found, found.long_part, console, "at the answer")
            seconds = time.perf_counter() - t0
            above = found.long_part + max(1, round(ABOVE_FRACTION * found.long_part))
            if found.at_limit:  # nothing above the position limit to trace
                continue
            if seconds <= ABOVE_TRACE_MAX_SECONDS:
                _trace_line(cfg, shape, device, budget, found, above, console, f"{ABOVE_FRACTION:.0%} longer")
            else:
                console.print(f"    not traced {ABOVE_FRACTION:.0%} longer: the trace at the answer took {seconds:.0f} s")
    return 0 if found_any else DOES_NOT_FIT


def _trace_line(cfg, shape, device: str, budget: int, found, length: int, console: Console, what: str) -> None:
    """Trace ``found``'s settings with the long part at ``length`` tokens and print the device peak against the
    budget."""
    from slimgrpo.output.console import quiet_third_party

    quiet_third_party(cfg.log.verbose)
    key = "data.max_prompt_length" if found.kind == "prompt-heavy" else "rollout.max_completion_length"
    traced_cfg = from_dict(merge_overrides(cfg.to_dict(), overrides_for(found.changes) + [f"{key}={length}"]),
                           base_dir=cfg.base_dir, origins=cfg.path_origins)
    result = trace_config(traced_cfg, shape, device)
    verdict = "[green]fits[/green]" if result.device_peak_bytes <= budget else "[red]over[/red]"
    host = f", host {format_gib(result.host_peak_bytes)} GiB" if result.host_peak_bytes else ""
    ratio = (f", trace / plan {result.peak_bytes / found.plan.tensor_peak_bytes:.2f}"
             if length == found.long_part and found.plan.tensor_peak_bytes else "")
    console.print(f"    trace {what} ({key}={length:,}): device peak {format_gib(result.device_peak_bytes)} GiB "
                  f"(tensors {format_gib(result.peak_bytes)} GiB{host}{ratio}, {result.seconds:.0f} s): {verdict} in "
                  f"{format_gib(budget)} GiB", soft_wrap=True)
