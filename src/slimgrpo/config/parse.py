"""From YAML and ``key=value`` overrides to a typed :class:`Config`, and back to YAML/JSON."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from slimgrpo.config.errors import ConfigError
from slimgrpo.config.paths import PathOrigin, resolve_paths
from slimgrpo.config.schema import iter_fields, type_name
from slimgrpo.config.tree import Config
from slimgrpo.config.trl_table import hint_for
from slimgrpo.config.validate import validate_config


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert a YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        if type(value) in args:  # "all-linear" for list[str] | str stays a string
            return value
        # Try non-str members first so "3" is not kept as a string when int is allowed.
        for a in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} is not a {type_name(tp)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}.{extra}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping (name: value), got {value!r}")
        return {_coerce(k, key_tp, key): _coerce(v, value_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "1e-6" as a string
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if _python_object(value) and key.startswith(_OBJECT_KEYS):
            return value  # from Python: a reward callable or model, an in-memory dataset
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise AssertionError(f"unsupported config type {tp} for {key}")


_OBJECT_KEYS = ("rewards.functions[", "data.path")


def _python_object(value: Any) -> bool:
    """A value only Python code can give: a callable, a model, a dataset or a list of rows."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return False
    return callable(value) or hasattr(value, "column_names") or (
        isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value))


def describe_object(value: Any) -> str:
    """How a Python object of the config is written to config.yaml: ``module:qualname`` for an importable
    function, ``<...>`` otherwise (the run folder then records what it was, not how to rebuild it)."""
    if hasattr(value, "column_names") or isinstance(value, list):
        return f"<in-memory dataset: {len(value)} rows>"
    config = getattr(value, "config", None)
    if config is not None and hasattr(value, "forward"):
        name = getattr(config, "name_or_path", "") or type(value).__name__
        return f"<loaded model {type(value).__name__} {name}>"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"
    return f"<callable {getattr(value, '__name__', type(value).__name__)}>"


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if _python_object(obj):
        return describe_object(obj)
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(unknown_key_message(prefix + str(key)))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return cls(**kwargs)


def all_keys() -> list[str]:
    return [k for k, *_ in iter_fields()]


def unknown_key_message(key: str) -> str:
    keys = all_keys()
    leaf = key.rsplit(".", 1)[-1]
    trl_hint = hint_for(leaf)  # a TRL name (bf16, gradient_accumulation_steps): say what slimgrpo calls it
    if trl_hint:
        return (f"unknown config key {key!r}. {trl_hint} (`slimgrpo train --trl-config FILE` reads a TRL "
                "grpo YAML as it is; `slimgrpo train --help-config` lists every key.)")
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    close += [k for k in keys if k.endswith("." + leaf) and k not in close]
    hint = f" Did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""
    return f"unknown config key {key!r}.{hint} (`slimgrpo train --help-config` lists every key.)"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``loss.beta=0.04`` -> (["loss", "beta"], 0.04); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. loss.beta=0.04)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        _set(data, parts, value, text)
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # unhashable key: let the base constructor report it
            continue
        if first is not None:
            raise ConfigError(f"{loader.name}: key {key!r} appears twice (lines {first} and "
                              f"{key_node.start_mark.line + 1}); the second would silently replace the first. "
                              "Merge them into one.")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        inside = sorted(x.name for x in p.glob("*.y*ml"))
        hint = f" (YAML files there: {', '.join(inside[:5])})" if inside else ""
        raise ConfigError(f"config {str(p)!r} is a folder, not a YAML file: give the file itself{hint}")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = str(p)
        try:
            data = loader.get_single_data() or {}
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"config file {str(p)!r} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def from_dict(data: dict[str, Any], base_dir: str = ".", origins: dict[str, PathOrigin] | None = None) -> Config:
    """A Config from nested sections. Relative paths in ``data`` are resolved against ``base_dir`` (the
    config file's folder; ``"."``: the working directory) by the one rule of ``config/paths.py``."""
    origins = dict(origins or {})
    source = "command line" if base_dir == "." else "config file"
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping of sections, got {data!r}")
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}  # sections: ours to change
    return _make(resolve_paths(data, base_dir, source, origins), base_dir, origins)


def _make(data: dict[str, Any], base_dir: str, origins: dict[str, PathOrigin]) -> Config:
    cfg = _build(Config, data, "")
    cfg.base_dir = os.path.abspath(base_dir)
    cfg.path_origins = origins
    return cfg


def apply_overrides(data: dict[str, Any], overrides: list[str], origins: dict[str, PathOrigin]) -> dict[str, Any]:
    """Merge ``key=value`` overrides into ``data``; their relative paths are taken from the working directory."""
    for text in overrides:
        parts, value = parse_override(text)
        single: dict[str, Any] = {}
        node = single
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
        for key in list(origins):  # the override replaces what the file said
            if key == ".".join(parts) or key.startswith(".".join(parts) + "."):
                del origins[key]
        resolve_paths(single, os.getcwd(), "command line", origins)
        node = single
        for p in parts[:-1]:
            node = node[p]
        _set(data, parts, node[parts[-1]], text)
    return data


def _set(data: dict[str, Any], parts: list[str], value: Any, text: str) -> None:
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {p!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | os.PathLike | None, overrides: list[str] = (), validate: bool = True) -> Config:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply overrides.

    The one rule for relative paths (``config/paths.py``): in the file, from the file's folder; in the
    overrides, from the working directory. Every path key then holds an absolute path."""
    origins: dict[str, PathOrigin] = {}
    data = read_yaml(path) if path else {}
    base = str(Path(path).resolve().parent) if path else "."
    data = resolve_paths(data, base, "config file" if path else "command line", origins)
    data = apply_overrides(data, list(overrides), origins)
    cfg = _make(data, base, origins)
    if validate:
        validate_config(cfg)
    return cfg


def resolve_path(cfg: Config, path: str) -> str:
    """A path of the config as a usable path. A config read by ``load_config`` / ``from_dict`` already
    holds absolute paths (or hub names); a Config built in Python code takes relative ones from the working
    directory, as Python does."""
    if not isinstance(path, str) or not path or os.path.isabs(path):
        return path  # an in-memory dataset from Python stays as it is
    return os.path.expanduser(path)


def plain_config(cfg: Config) -> dict[str, Any]:
    """The config as config.yaml holds it: plain YAML types, a Python object from the API written as what it
    was (``describe_object``), secrets scrubbed."""
    from slimgrpo.redact import scrub

    return scrub(_plain(cfg.to_dict()))


def dump_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (secrets scrubbed)."""
    Path(path).write_text(yaml.safe_dump(plain_config(cfg), sort_keys=False))


def config_to_json(cfg: Config) -> str:
    return json.dumps(plain_config(cfg), indent=2)
