"""TRL's configuration classes as slimgrpo reads them: ``GRPOConfig``, ``ModelConfig``, ``ScriptArguments``,
``GRPOScriptArguments`` (TRL 1.16) and ``PPOConfig`` (TRL 1.12's, the last TRL with PPO), with every field TRL
declares and TRL's default for it, built from ``fields.json`` (``scripts/gen_trl_fields.py``) so that neither
TRL nor its ``TrainingArguments`` need be installed or imported.

They are real dataclasses: a script constructs them with keywords, reads and writes their attributes, and parses
them from the command line with ``transformers.HfArgumentParser`` or TRL's ``TrlParser``, as it does TRL's. What
slimgrpo does with each field is the rules table's (``config/trl_table.py``, the one ``slimgrpo train
--trl-config`` follows): ``GRPOConfig(...)`` refuses a field set to a value slimgrpo cannot honour at
construction, naming the field, the value and why, as TRL raises for its own bad arguments, and says once which
fields it takes but ignores (``slimgrpo.trl`` logger).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from importlib import resources
from typing import Any, Literal

from slimgrpo.config.trl_rules import Refused
from slimgrpo.config.trl_table import BY_KEY

log = logging.getLogger("slimgrpo.trl")

# A type as fields.json spells it -> the annotation the dataclass carries (what HfArgumentParser reads).
_NAMESPACE = {"Literal": Literal, "None": None, "bool": bool, "int": int, "float": float, "str": str, "dict": dict,
              "list": list}
_IGNORED_SAID: set[str] = set()  # each ignored field is said once per process


def _fields(part: str, cls: str) -> dict[str, dict[str, Any]]:
    data = json.loads(resources.files("slimgrpo.trl").joinpath("fields.json").read_text(encoding="utf-8"))
    return data[part][cls]


def _annotation(spelled: str):
    return eval(spelled, dict(_NAMESPACE))  # noqa: S307 - our own JSON: a type spelled with the names above


def _field(spec: dict[str, Any]) -> tuple[Any, dataclasses.Field]:
    default = spec["default"]
    if isinstance(default, (list, dict)):
        return _annotation(spec["type"]), dataclasses.field(default_factory=lambda d=default: json.loads(json.dumps(d)))
    return _annotation(spec["type"]), dataclasses.field(default=default)


def _make(name: str, part: str, doc: str, bases: tuple = (), post_init=None):
    spec = _fields(part, name)
    namespace = {"__doc__": doc, "__module__": __name__}
    if post_init is not None:
        namespace["__post_init__"] = post_init
    return dataclasses.make_dataclass(name, [(key, *_field(s)) for key, s in spec.items()], bases=bases,
                                      namespace=namespace)


def given_fields(config: Any) -> dict[str, Any]:
    """The fields of a TRL config whose value differs from TRL's default: what the script set (the rules table
    converts these, as ``--trl-config`` converts the keys a YAML sets). A field TRL derives after construction
    (``bf16`` from ``fp16``, the generation batch) counts as set only where the script set it."""
    defaults = _DEFAULTS[type(config).__name__]
    as_given = config.__dict__.get("_as_given", {})
    values = {f.name: as_given.get(f.name, getattr(config, f.name)) for f in dataclasses.fields(config)}
    return {k: v for k, v in values.items() if v != defaults.get(k)}


def check_fields(config: Any, owner: str) -> None:
    """Refuse the first field the rules table refuses for its value (``ValueError`` naming it), say once which
    set fields change nothing in slimgrpo. ``owner``: the class name said in the messages."""
    given = given_fields(config)
    ignored = []
    for key, value in given.items():
        rule = BY_KEY.get(key)
        if rule is None or key in _DERIVED:
            continue
        if rule.kind == "ignore":
            ignored.append(key)
            continue
        try:
            rule.apply(value, {**given, "__base_dir__": "."})
        except Refused as e:
            raise ValueError(f"{owner}({key}={value!r}): slimgrpo cannot honour it: {e}") from None
    fresh = [k for k in ignored if k not in _IGNORED_SAID]
    if fresh:
        _IGNORED_SAID.update(fresh)
        log.warning("%s: slimgrpo takes but ignores %s (docs/trl-migration.md says why for each)", owner,
                    ", ".join(fresh))


# Fields TRL fills in from others after construction: their values are TRL's consequences, not the script's.
_DERIVED = ("bf16", "generation_batch_size", "steps_per_generation", "scale_rewards")


def _grpo_post_init(self) -> None:
    """TRL 1.16's derivations and its own refusals of bad combinations (``GRPOConfig.__post_init__``), then the
    rules table's verdict on every field the script set."""
    self._as_given = {k: getattr(self, k) for k in _DERIVED}
    if self.bf16 is None:
        self.bf16 = not self.fp16
    self.scale_rewards = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
    if self.auto_find_batch_size:
        raise ValueError("auto_find_batch_size is not supported by GRPO: the generation batch must hold whole "
                         "groups of num_generations completions; lower per_device_train_batch_size instead")
    per_step = self.per_device_train_batch_size * _world_size()
    if self.generation_batch_size is None and self.steps_per_generation is None:
        self.steps_per_generation = self.gradient_accumulation_steps
        self.generation_batch_size = per_step * self.steps_per_generation
    elif self.generation_batch_size is not None and self.steps_per_generation is None:
        if self.generation_batch_size % per_step:
            raise ValueError(f"generation_batch_size ({self.generation_batch_size}) must be divisible by the global "
                             f"batch size ({per_step})")
        self.steps_per_generation = self.generation_batch_size // per_step
    elif self.generation_batch_size is None:
        self.generation_batch_size = per_step * self.steps_per_generation
    else:
        raise ValueError("'generation_batch_size' and 'steps_per_generation' can not be both configured at the "
                         "same time")
    if self.generation_batch_size % self.num_generations:
        raise ValueError(f"generation_batch_size ({self.generation_batch_size}) must be divisible by "
                         f"num_generations ({self.num_generations})")
    if self.num_generations < 2:
        raise ValueError(f"GRPO requires at least 2 generations per prompt to calculate the advantages, got "
                         f"num_generations={self.num_generations}")
    check_fields(self, "GRPOConfig")


def _ppo_post_init(self) -> None:
    self._as_given = {"bf16": self.bf16}
    if self.bf16 is None:
        self.bf16 = not self.fp16
    check_fields(self, "PPOConfig")  # refused on the PPOConfig(...) line, as GRPOConfig's


def _world_size() -> int:
    """The processes of a torchrun job (``WORLD_SIZE``), as TrainingArguments reads it; 1 outside one."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1") or 1)


GRPOConfig = _make("GRPOConfig", "grpo", "TRL 1.16's ``GRPOConfig``: every field, TRL's defaults (module docstring).",
                   post_init=_grpo_post_init)
ModelConfig = _make("ModelConfig", "grpo", "TRL's ``ModelConfig`` (model name or path, dtype, LoRA / QLoRA flags).")
ScriptArguments = _make("ScriptArguments", "grpo", "TRL's ``ScriptArguments`` (the dataset a script reads).")
GRPOScriptArguments = _make("GRPOScriptArguments", "grpo", "TRL's ``GRPOScriptArguments`` (the dataset and reward "
                                                           "functions of ``trl grpo``).")
PPOConfig = _make("PPOConfig", "ppo", "TRL 1.12's ``PPOConfig`` (``trl.experimental.ppo``, the last with PPO).",
                  post_init=_ppo_post_init)
_DEFAULTS = {cls.__name__: {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                            for f in dataclasses.fields(cls)}
             for cls in (GRPOConfig, ModelConfig, ScriptArguments, GRPOScriptArguments, PPOConfig)}



def trl_default(key: str, missing: Any = None) -> Any:
    """TRL's default for ``key`` in GRPOConfig, ModelConfig or ScriptArguments (fields.json); ``missing`` where
    none of them has the key."""
    for cls in ("GRPOConfig", "ModelConfig", "ScriptArguments", "GRPOScriptArguments"):
        if key in _DEFAULTS[cls]:
            return _DEFAULTS[cls][key]
    return missing


# TrainingArguments' methods scripts call on a config.
for _cls in (GRPOConfig, PPOConfig):
    _cls.to_dict = lambda self: dataclasses.asdict(self)  # noqa: E731
    _cls.to_json_string = lambda self: json.dumps(dataclasses.asdict(self), indent=2, default=str)  # noqa: E731

__all__ = ["GRPOConfig", "GRPOScriptArguments", "ModelConfig", "PPOConfig", "ScriptArguments", "check_fields",
           "given_fields"]
