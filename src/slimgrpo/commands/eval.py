"""``slimgrpo eval``: accuracy and pass@k of one model (or two side by side) on a prompts file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slimgrpo.config import Config, ConfigError, from_dict, load_config, merge_overrides, resolve_path
from slimgrpo.config.paths import RULE, check_inputs_exist, describe, shown
from slimgrpo.data import load_prompt_dataset
from slimgrpo.evaluate import EvalResult, EvalSettings, evaluate
from slimgrpo.modeling import (ModelLoadError, adapters_in_input_dtype, load_model, load_tokenizer, resolve_device,
                               resolve_dtype)
from slimgrpo.rewards.loading import load_reward_functions
from slimgrpo.rewards.scoring import RewardRunner
from slimgrpo.rollout.sampling import SamplingParams
from slimgrpo.units import column_labels


def flag_origin(flag: str, value: str) -> str:
    """``--model 'x' (relative to the working directory, /cwd)``: where a path given as a flag was looked for."""
    if os.path.isabs(os.path.expanduser(value)):
        return f"{flag} {value!r}"
    return f"{flag} {value!r} (relative to the working directory, {os.getcwd()})"


def load_for_eval(path: str, cfg: Config, origin: str | None = None):
    """A model folder, a training checkpoint folder, or a peft adapter folder (base read from it).
    ``origin`` says where ``path`` came from, for the error message (``--model ...`` / ``model.path ...``)."""
    p = given = Path(path).expanduser()
    from slimgrpo.modeling import looks_like_hub_name

    if not p.exists() and not looks_like_hub_name(path):
        raise ModelLoadError(f"{origin or flag_origin('--model', path)}: {p.absolute()} does not exist; give a "
                             "model folder, a run's final/ folder, a checkpoints/checkpoint-<step> folder or an "
                             f"adapter folder. ({RULE})")
    if (p / "model").is_dir() and (p / "trainer_state.json").is_file():
        p = p / "model"  # a slimgrpo checkpoint
    device = resolve_device(cfg.run.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    if (p / "adapter_config.json").is_file():
        from peft import PeftModel

        base_path = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base_path:
            raise ModelLoadError(f"{p}: adapter_config.json names no base model")
        tok_dir = p if (p / "tokenizer.json").is_file() else Path(base_path)
        base = load_model(cfg.model.__class__(**{**cfg.model.__dict__, "path": base_path}), device, dtype)
        model = PeftModel.from_pretrained(base, str(p)).to(device)
        adapters_in_input_dtype(model)  # the adapters compute as they did in training
        return model.eval(), load_tokenizer(str(tok_dir))
    model = load_model(cfg.model.__class__(**{**cfg.model.__dict__, "path": str(p)}), device, dtype)
    return model.eval(), load_tokenizer(str(find_tokenizer(p, given, cfg)))


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def find_tokenizer(model_dir: Path, given: Path, cfg: Config) -> Path:
    """The tokenizer for a model folder: beside the weights, the config's model.tokenizer_path / model.path,
    or, for a checkpoint without a config, the run's final/ folder and the model named by the run's
    config.yaml."""
    import yaml

    if _has_tokenizer(model_dir):
        return model_dir
    if cfg.model.tokenizer_path or cfg.model.path:
        return Path(resolve_path(cfg, cfg.model.tokenizer_path or cfg.model.path))
    looked = [model_dir]
    for run in (given, given.parent.parent):  # a checkpoint folder, or checkpoints/checkpoint-N in a run folder
        if _has_tokenizer(run / "final"):
            return run / "final"
        looked.append(run / "final")
        for saved in (given / "config.yaml", run / "config.yaml"):
            try:
                model = (yaml.safe_load(saved.read_text()) or {}).get("model", {})
            except (OSError, yaml.YAMLError, AttributeError):
                continue
            for key in ("tokenizer_path", "path"):
                candidate = Path(str(model.get(key) or ""))
                if model.get(key) and _has_tokenizer(candidate):
                    return candidate
                if model.get(key):
                    looked.append(candidate)
    shown = ", ".join(dict.fromkeys(str(x) for x in looked))
    raise ModelLoadError(f"no tokenizer found for {given} (looked in {shown}): pass the training config "
                         f"(slimgrpo eval CONFIG --model {given}) or model.tokenizer_path=PATH")


def run_eval(model_path: str, cfg: Config, args, origin: str | None = None) -> EvalResult:
    model, tok = load_for_eval(model_path, cfg, origin)
    data_cfg = cfg.data
    if args.limit:
        data_cfg.max_samples = args.limit
    dataset = load_prompt_dataset(resolve_path(cfg, args.data or cfg.data.path), tok, data_cfg)
    r = cfg.rollout
    agent, agent_rewards = None, []
    if r.tools or r.environment:  # the multi-turn rollout of training, with the same tools / environments
        from slimgrpo.agent.setup import build_agent
        from slimgrpo.rollout.engine import TorchRolloutEngine

        agent = build_agent(cfg, TorchRolloutEngine(model, max_batch_rows=r.max_batch_rows), tok)
        agent_rewards = agent.toolbox.reward_functions()  # get_reward() of each environment class
    weights = None if args.rewards else cfg.rewards.reward_weights
    runner = RewardRunner(load_reward_functions(args.rewards or cfg.rewards.functions, cfg.base_dir) + agent_rewards,
                          None if weights is None else [*weights, *[1.0] * len(agent_rewards)], on_error="zero")
    eos = {tok.eos_token_id}
    params = SamplingParams(max_new_tokens=r.max_completion_length, temperature=r.temperature, top_p=r.top_p,
                            top_k=r.top_k, min_p=r.min_p, repetition_penalty=r.repetition_penalty,
                            eos_token_ids=tuple(sorted(eos)), pad_token_id=tok.pad_token_id)
    settings = EvalSettings(params, num_samples=args.num_samples, ks=tuple(args.k), seed=cfg.run.seed,
                            success_threshold=args.threshold, keep_prompts=args.json_samples if args.json_out else 0)
    return evaluate(model, tok, dataset, runner, settings, agent=agent)


def eval_command(args) -> int:
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides.insert(0, args.config)
        args.config = None
    cfg = load_config(args.config, args.overrides, validate=False) if args.config else \
        from_dict(merge_overrides({}, list(args.overrides)))
    model = args.model or cfg.model.path
    if not model:
        raise ConfigError("slimgrpo eval: give --model PATH (or a config with model.path)")
    if not (args.data or cfg.data.path):
        raise ConfigError("slimgrpo eval: give --data PROMPTS (or a config with data.path)")
    if args.json_samples < 0:
        raise ConfigError(f"--json-samples must be >= 0 (prompts whose completions --json keeps), "
                          f"got {args.json_samples}")
    if args.data:
        _check_flag_path("--data", args.data)
    else:
        check_inputs_exist(cfg, ("data.path",))
    origin = flag_origin("--model", args.model) if args.model else describe(cfg, "model.path")
    if not (args.rewards or cfg.rewards.functions or cfg.rollout.environment):  # (or an environment's get_reward)
        raise ConfigError("slimgrpo eval: give --rewards FN [FN ...] (or a config with rewards.functions)")
    if any(k > args.num_samples for k in args.k):
        raise ConfigError(f"pass@k needs --num-samples >= {max(args.k)}")
    from slimgrpo.output.console import quiet_third_party

    quiet_third_party(cfg.log.verbose)
    models = [model] + ([args.compare] if args.compare else [])
    if not args.model:  # say which model, and from where: the config's model.path, resolved by the one rule
        Console().print(f"model: {shown(model)} (model.path of {args.config})" if args.config else f"model: {model}",
                        soft_wrap=True, highlight=False)
    origins = {model: origin, **({args.compare: flag_origin("--compare", args.compare)} if args.compare else {})}
    results = {m: run_eval(m, cfg, args, origins[m]) for m in models}
    table = results_table(results, models, cfg, args)
    console = Console()
    need = console.measure(table, options=console.options.update(max_width=10_000)).maximum
    console = Console(width=max(console.width, need))  # never cut a number or a header
    console.print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {m: {**r.to_dict(), "samples": r.samples} for m, r in results.items()}, indent=2, ensure_ascii=False))
    return 0


def _check_flag_path(flag: str, value: str) -> None:
    from slimgrpo.config.paths import looks_like_hub_name

    if not os.path.exists(os.path.expanduser(value)) and not looks_like_hub_name(value):
        raise ConfigError(f"{flag_origin(flag, value)}: {Path(value).expanduser().absolute()} does not exist. "
                          f"({RULE})")


def decoding_line(cfg: Config, args) -> str:
    r = cfg.rollout
    n = args.num_samples
    parts = [f"temperature {r.temperature}"] + ([f"top_p {r.top_p}"] if r.top_p < 1 else []) + \
        ([f"top_k {r.top_k}"] if r.top_k else []) + ([f"min_p {r.min_p}"] if r.min_p else [])
    return (f"{n} {'sample' if n == 1 else 'samples'} per prompt, {', '.join(parts)}, at most "
            f"{r.max_completion_length} new tokens, seed {cfg.run.seed}; correct = first reward function >= "
            f"{args.threshold}")


def results_table(results: dict[str, EvalResult], models: list[str], cfg: Config, args) -> Table:
    """One column per model (mean ± standard error over prompts where known), and B - A when comparing."""
    first = results[models[0]]
    n = first.num_prompts
    table = Table(title=f"{n} {'prompt' if n == 1 else 'prompts'}: {decoding_line(cfg, args)}",
                  title_justify="left")
    table.add_column("metric", no_wrap=True)
    labels = column_labels(models)
    for label in labels:
        table.add_column(label, justify="right", no_wrap=True)
    if len(models) == 2:
        table.add_column("change", justify="right", no_wrap=True)
    for key in first.to_dict():
        if key in ("num_prompts", "num_samples"):
            continue
        row = [key]
        for m in models:
            v = results[m].to_dict().get(key, float("nan"))
            se = results[m].stderr.get(key)
            row.append(f"{v:.4f}" + (f" ± {se:.4f}" if se is not None and se == se else ""))
        if len(models) == 2:
            a, b = (results[m].to_dict().get(key, float("nan")) for m in models)
            ses = [results[m].stderr.get(key) for m in models]
            se = (ses[0] ** 2 + ses[1] ** 2) ** 0.5 if None not in ses else None
            row.append(f"{b - a:+.4f}" + (f" ± {se:.4f}" if se is not None and se == se else ""))
        table.add_row(*row)
    table.caption = "± = standard error over prompts" + (
        f"; change = {labels[1]} - {labels[0]} (its ± treats the two as independent)" if len(models) == 2 else "")
    table.caption_justify = "left"
    return table
