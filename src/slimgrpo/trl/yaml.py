"""From a ``trl grpo`` YAML to a slimgrpo :class:`Config`, with a report of what happened to every key."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimgrpo.config.trl_rules import TRL_DEFAULTS, TRL_DEFAULTS_APPLIED, TRL_LORA_DEFAULTS_APPLIED, Refused
from slimgrpo.config.trl_table import BY_KEY
from slimgrpo.families import llama_like


@dataclass
class Row:
    key: str  # TRL key (or "(default)")
    status: str  # mapped | ignored | refused | default
    detail: str


@dataclass
class Conversion:
    values: dict[str, Any] = field(default_factory=dict)  # slimgrpo dotted key -> value
    rows: list[Row] = field(default_factory=list)

    @property
    def refused(self) -> list[Row]:
        return [row for row in self.rows if row.status == "refused"]


def _trl_default(key: str) -> Any:
    """TRL's own default for ``key``, as fields.json holds it (no trl import); a sentinel for an unknown key."""
    from slimgrpo.trl.configs import trl_default

    return trl_default(key, _NO_DEFAULT)


_NO_DEFAULT = object()


def _fmt(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def convert(trl: dict[str, Any], base_dir: str = ".") -> Conversion:
    """Map every key of a ``trl grpo`` YAML; unknown keys and values slimgrpo cannot honour are refused."""
    from slimgrpo.config import all_keys

    from slimgrpo.config import iter_fields

    known = set(all_keys())
    nullable = {k for k, tp, default, _ in iter_fields() if default is None or "None" in str(tp)}
    out = Conversion()
    context = {**trl, "__base_dir__": base_dir}
    for key, value in trl.items():
        rule = BY_KEY.get(key)
        if rule is None:
            out.rows.append(Row(key, "refused", "not a key of TRL 1.16's GRPOConfig / ModelConfig / ScriptArguments"))
            continue
        if rule.kind == "ignore":
            out.rows.append(Row(key, "ignored", rule.note))
            continue
        try:
            mapped = rule.apply(value, context)
        except Refused as e:
            out.rows.append(Row(key, "refused", f"{_fmt(value)}: {e}"))
            continue
        if rule.kind == "refuse":
            out.rows.append(Row(key, "ignored", f"{_fmt(value)} changes nothing"))
            continue
        mapped = {k: v for k, v in mapped.items() if v is not None or k in nullable or k not in known}
        missing = [k for k in mapped if k not in known]
        if missing:  # a slimgrpo key this build does not have yet (e.g. a newer loss option)
            if value == _trl_default(key):
                out.rows.append(Row(key, "ignored", f"TRL's default; {', '.join(missing)} is not in this build"))
            else:
                out.rows.append(Row(key, "refused", f"{_fmt(value)}: {', '.join(missing)} is not in this build"))
            continue
        out.values.update(mapped)
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in mapped.items()) or "accepted (no change needed)"
        out.rows.append(Row(key, "mapped", shown))
    _apply_trl_run_defaults(trl, out, base_dir)
    return out


def _apply_trl_run_defaults(trl: dict[str, Any], out: Conversion, base_dir: str = ".") -> None:
    """TRL's defaults where the YAML (or script) is silent: those that decide what a run *is* (its length, batch,
    folder) and those of ``TRL_DEFAULTS_APPLIED`` (what is learnt, and LoRA's with use_peft); slimgrpo's own
    defaults stay for the rest (docs/trl-migration.md lists those that differ, and why)."""
    gives_steps = (trl.get("max_steps") or -1) > 0
    if not gives_steps and "num_train_epochs" not in trl:
        out.values["run.num_train_epochs"] = TRL_DEFAULTS["num_train_epochs"]
        out.rows.append(Row("num_train_epochs", "default", "TRL's 3 epochs (the YAML sets neither max_steps nor "
                                                           "num_train_epochs)"))
    if "per_device_train_batch_size" not in trl and "gradient_accumulation_steps" not in trl:
        size = TRL_DEFAULTS["per_device_train_batch_size"]
        out.values.update({"run.batch_size": size, "memory.micro_batch_size": size})
        out.rows.append(Row("per_device_train_batch_size", "default", f"TRL's {size} completions per step"))
    if "output_dir" not in trl:
        out.values["run.output_dir"] = "trainer_output"
        out.rows.append(Row("output_dir", "default", "TRL's trainer_output"))
    silent = [k for k in TRL_DEFAULTS_APPLIED if k not in trl]
    if trl.get("use_peft"):
        silent += [k for k in TRL_LORA_DEFAULTS_APPLIED if k not in trl]
    context = {**trl, "__base_dir__": base_dir}
    for key in silent:
        if key == "lora_target_modules" or any(t in out.values for t in BY_KEY[key].targets):
            continue  # peft's choice below; a key another TRL name set (PPO's response_length) keeps its value
        mapped = BY_KEY[key].apply(TRL_DEFAULTS[key], context)
        out.values.update(mapped)
        out.rows.append(Row(key, "default", "TRL's " + ", ".join(f"{k}={_fmt(v)}" for k, v in mapped.items())))
    # TRL: a reward function's None means "not applicable to this row" (a code reward on a maths prompt), and one
    # that is never applicable for a while does not stop the run; slimgrpo's warning each such step stays.
    out.values["rewards.max_failed_steps"] = 0
    out.rows.append(Row("reward_funcs", "default", "TRL's: a function returning None for every completion "
                                                   "never stops the run (rewards.max_failed_steps=0; still warned "
                                                   "each step)"))
    if trl.get("use_peft") and trl.get("lora_target_modules") is None:
        model = trl.get("model_name_or_path")
        targets = peft_default_targets(model_type_of(model, base_dir) if model else None)
        if targets is not None:
            out.values["lora.target_modules"] = targets
            out.rows.append(Row("lora_target_modules", "default", f"peft's default for the architecture, {targets}"))
        else:
            out.rows.append(Row("lora_target_modules", "default", "peft's default for this model could not be read "
                                                                  "(not a local folder, or an architecture slimgrpo "
                                                                  "plans no LoRA for): slimgrpo's all-linear"))


def model_type_of(model: Any, base_dir: str = ".") -> str | None:
    """The ``model_type`` of a loaded model or of a local model folder's config.json; None where neither."""
    config = getattr(model, "config", None)
    if config is not None:
        return getattr(config, "model_type", None)
    folder = Path(base_dir) / os.fspath(model) if not os.path.isabs(os.fspath(model)) else Path(os.fspath(model))
    try:
        import json

        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def peft_default_targets(model_type: str | None) -> list[str] | None:
    """The modules peft puts LoRA on when ``target_modules`` is None (its table per architecture), for the
    families slimgrpo plans (``families.py``); None otherwise."""
    if not llama_like(model_type):
        return None
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as BY_TYPE

    targets = BY_TYPE.get(model_type)
    return sorted(targets) if targets else None


def nest(values: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in values.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def render(conversion: Conversion) -> str:
    """The report: one line per key, grouped mapped / defaults / ignored / refused."""
    lines = []
    for status, title in (("mapped", "mapped"), ("default", "TRL defaults applied"), ("ignored", "ignored"),
                          ("refused", "REFUSED")):
        rows = [r for r in conversion.rows if r.status == status]
        if not rows:
            continue
        lines.append(f"{title} ({len(rows)}):")
        width = max(len(r.key) for r in rows)
        lines += [f"  {r.key:<{width}}  {r.detail}" for r in rows]
    return "\n".join(lines)


def read_trl_yaml(path: str | os.PathLike) -> dict[str, Any]:
    from slimgrpo.config import ConfigError, read_yaml

    data = read_yaml(path)
    nested = [k for k, v in data.items() if isinstance(v, dict) and k not in BY_KEY]
    if nested:
        raise ConfigError(
            f"{path}: {nested[0]!r} is a section; a TRL grpo YAML is flat (GRPOConfig and model/script fields). "
            "For a slimgrpo config drop --trl-config: slimgrpo train CONFIG"
        )
    return data


# TRL keys naming a path, and the slimgrpo key that says how (config/paths.py's rule).
_TRL_PATH_KEYS = {"output_dir": "run.output_dir", "model_name_or_path": "model.path", "dataset_name": "data.path"}


def _from_working_dir(key: str, value):
    """A TRL key=value override naming a path is taken from the working directory, as slimgrpo's own."""
    from slimgrpo.config.paths import resolve_paths

    if key not in _TRL_PATH_KEYS or not isinstance(value, str):
        return value
    section, leaf = _TRL_PATH_KEYS[key].split(".")
    return resolve_paths({section: {leaf: value}}, os.getcwd(), "command line")[section][leaf]


def load_trl_config(path: str | os.PathLike, overrides: list[str] = (), show=print):
    """Read a ``trl grpo`` YAML, print what happened to each key, and return the slimgrpo Config.

    Overrides without a dot are TRL keys (``max_steps=2``), with a dot slimgrpo keys (``run.seed=1``);
    TRL ones are applied before the mapping, slimgrpo ones after. Refused keys raise ConfigError (exit 2).
    """
    from slimgrpo.config import ConfigError, from_dict, merge_overrides, parse_override, validate_config

    trl = read_trl_yaml(path)
    slim_overrides = []
    for text in overrides:
        parts, value = parse_override(text)
        if len(parts) == 1:
            trl[parts[0]] = _from_working_dir(parts[0], value)
        else:
            slim_overrides.append(text)
    base_dir = str(Path(path).resolve().parent)
    conversion = convert(trl, base_dir)
    show(f"{path}: TRL grpo config -> slimgrpo\n{render(conversion)}")
    if conversion.refused:
        keys = ", ".join(r.key for r in conversion.refused)
        raise ConfigError(f"{path}: slimgrpo cannot honour {keys} (see REFUSED above): remove them or set them "
                          "to TRL's default, then use slimgrpo keys as key=value overrides")
    data = merge_overrides(nest(conversion.values), slim_overrides)
    cfg = from_dict(data, base_dir=base_dir)
    if "max_prompt_length" not in trl and not any(o.startswith("data.max_prompt_length=") for o in slim_overrides):
        fit_prompt_length(cfg, show)
    validate_config(cfg)
    return cfg


def _context_room(cfg) -> tuple[int, int] | None:
    """``(context, room)``: the model's positions and what ``max_completion_length`` leaves of them for the
    prompt, read from a local folder's config.json or, for a hub name, from the local hub cache only (nothing
    is downloaded here); None where neither can be read."""
    from slimgrpo.config import resolve_path
    from slimgrpo.modeling import looks_like_hub_name, max_positions, read_model_config

    path = resolve_path(cfg, cfg.model.path)
    if not path:
        return None
    try:
        if looks_like_hub_name(path):
            from transformers import AutoConfig

            model_config = AutoConfig.from_pretrained(path, local_files_only=True).to_dict()
        else:
            model_config = read_model_config(path)
        context = max_positions(model_config)
    except Exception:  # a missing model is reported later, where it is loaded
        return None
    return (context, context - cfg.rollout.max_completion_length) if context else None


def fit_prompt_length(cfg, show=print, tools: bool = False) -> None:
    """TRL 1.16 does not cut prompts; slimgrpo keeps the last data.max_prompt_length tokens. Without the key,
    keep slimgrpo's default unless the model's context is shorter: then use what the completion leaves. With
    ``tools`` (tools or an environment: every prompt carries the tools' schemas, which the default was not
    sized for) the bound is what the completion leaves of the context, as TRL's uncut prompts."""
    found = _context_room(cfg)
    if found is None:
        return
    context, room = found
    if room > 0 and (room < cfg.data.max_prompt_length or (tools and room > cfg.data.max_prompt_length)):
        cfg.data.max_prompt_length = room
        show(f"data.max_prompt_length={room}: the model's {context} positions minus max_completion_length "
             "(TRL 1.16 does not cut prompts; slimgrpo keeps their last tokens)")
