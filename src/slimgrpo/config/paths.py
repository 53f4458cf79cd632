"""The one rule for relative paths in a config, applied once, when the config is read.

* A relative path **written in a config file** is taken from **that file's folder**.
* A relative path **given on the command line** (``key=value`` overrides, ``--model``, ``--data``) is taken
  from the **working directory**, where the user typed it.
* ``~`` is expanded; absolute paths stay as they are; a hub name (``org/name``) stays as written where the
  key accepts one and no such local path exists.

The path keys are :data:`PATH_KEYS` (files and folders) and :data:`CODE_KEYS` (``file.py:function``
specs: only the file part is a path; ``package.module:function`` stays as written). After loading, each of
them holds an absolute path, so every command (train, eval, plan, export) and the run folder's
config.yaml read the same file whatever the working directory; :func:`describe` tells, for an error
message, the key, the path as written and the folder it was resolved against.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from slimgrpo.config.errors import ConfigError

# Keys naming a file or folder. Those in HUB_KEYS may also name a hub model or dataset (``org/name``).
PATH_KEYS = ("model.path", "model.tokenizer_path", "data.path", "eval.data", "critic.model_path",
             "run.output_dir", "run.resume")
HUB_KEYS = ("model.path", "model.tokenizer_path", "data.path", "eval.data", "critic.model_path")
# Keys that must name something that exists when they are used (run.output_dir is made by the run).
INPUT_KEYS = ("model.path", "model.tokenizer_path", "data.path", "eval.data", "critic.model_path")
# Keys holding ``file.py:name`` specs (or lists / mappings of them).
CODE_KEYS = ("rewards.functions", "rollout.tools", "rollout.environment", "rollout.rollout_function")
_NOT_PATHS = {"run.resume": ("auto", "never")}  # words, not paths

RULE = ("relative paths in a config file are taken from the file's folder; in key=value overrides and "
        "--flags, from the working directory")


@dataclass(frozen=True)
class PathOrigin:
    written: str  # the value as the user wrote it
    base: str  # the folder it was resolved against
    source: str  # "config file" or "command line"

    def describe(self, key: str) -> str:
        where = "the config file's folder" if self.source == "config file" else "the working directory"
        return f"{key} {self.written!r} (relative to {where}, {self.base})"


# A name ending so is a file, never a hub repository (``data/heldout.jsonl`` is a path, ``org/name`` a repo).
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".gguf", ".safetensors",
                 ".yaml", ".yml")


def looks_like_hub_name(value: str) -> bool:
    return (bool(re.fullmatch(r"[A-Za-z0-9_\-.]+/[A-Za-z0-9_\-.]+", value)) and not value.startswith(".")
            and not value.lower().endswith(FILE_SUFFIXES))


def _resolve(key: str, value: str, base: str) -> str:
    """One path value, as the rule says."""
    if not value or value in _NOT_PATHS.get(key, ()):
        return value
    expanded = os.path.expanduser(value)
    if os.path.isabs(expanded):
        return os.path.normpath(expanded)
    resolved = os.path.normpath(os.path.join(base, expanded))
    if key in HUB_KEYS and looks_like_hub_name(value) and not os.path.exists(resolved):
        return value  # a hub name, as written (only used when the machine is online)
    return resolved


def _resolve_spec(value: Any, base: str) -> Any:
    """``file.py:name`` -> ``/abs/file.py:name``; a reward-model folder that exists -> its absolute path;
    ``package.module:name`` and built-in names as written."""
    if not isinstance(value, str) or not value.strip():
        return value
    target, sep, name = value.strip().rpartition(":")
    if not sep:
        target, name = value.strip(), ""
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", target):
        return value
    expanded = os.path.expanduser(target)
    if not os.path.isabs(expanded):
        candidate = os.path.normpath(os.path.join(base, expanded))
        if not sep and not os.path.exists(candidate):
            return value  # neither a file spec nor an existing folder: the loader says what is wrong
        expanded = candidate
    return f"{os.path.normpath(expanded)}{sep}{name}"


def _get(data: dict[str, Any], key: str) -> tuple[dict[str, Any] | None, str]:
    section, _, leaf = key.partition(".")
    node = data.get(section)
    return (node, leaf) if isinstance(node, dict) and leaf in node else (None, leaf)


def resolve_paths(data: dict[str, Any], base: str, source: str,
                  origins: dict[str, PathOrigin] | None = None) -> dict[str, Any]:
    """Resolve every path key present in the raw config ``data`` (nested sections) against ``base``,
    in place; record in ``origins`` what each relative path was and where it was resolved."""
    base = os.path.abspath(base)
    for key in PATH_KEYS:
        node, leaf = _get(data, key)
        if node is None or not isinstance(node[leaf], str):
            continue
        written = node[leaf]
        node[leaf] = _resolve(key, written, base)
        _record(origins, key, written, node[leaf], base, source)
    for key in CODE_KEYS:
        node, leaf = _get(data, key)
        if node is None:
            continue
        value = node[leaf]
        if isinstance(value, list):
            node[leaf] = [_resolve_spec(v, base) for v in value]
        elif isinstance(value, dict):
            node[leaf] = {k: _resolve_spec(v, base) for k, v in value.items()}
        else:
            node[leaf] = _resolve_spec(value, base)
        _record(origins, key, value, node[leaf], base, source)
    return data


def _record(origins: dict[str, PathOrigin] | None, key: str, written: Any, resolved: Any, base: str,
            source: str) -> None:
    """Remember a relative path's origin (an absolute one needs no explanation)."""
    if origins is not None and resolved != written:
        origins[key] = PathOrigin(str(written), base, source)


def describe(cfg: Any, key: str, value: str | None = None) -> str:
    """``model.path '../m' (relative to the config file's folder, /abs/examples)`` for an error message;
    the key and the value alone when it was absolute or set from Python."""
    origin = cfg.path_origins.get(key)
    if origin is not None:
        return origin.describe(key)
    if value is None:
        section, _, leaf = key.partition(".")
        value = getattr(getattr(cfg, section), leaf)
    return f"{key} {value!r}"


def check_inputs_exist(cfg: Any, keys: tuple[str, ...] = INPUT_KEYS) -> None:
    """Every input path of ``keys`` that is set names something that exists (or is a hub name): else a
    ConfigError naming the key, the path as written, the folder it was resolved against and the full path."""
    for key in keys:
        section, _, leaf = key.partition(".")
        value = getattr(getattr(cfg, section), leaf)
        if not isinstance(value, str) or not value or os.path.exists(value):
            continue
        if key in HUB_KEYS and looks_like_hub_name(value) and not os.path.isabs(value):
            continue
        raise ConfigError(f"{describe(cfg, key, value)}: {value} does not exist. {RULE}.")
    if keys is INPUT_KEYS:  # and the files of file.py:name specs
        for key in CODE_KEYS:
            section, _, leaf = key.partition(".")
            value = getattr(getattr(cfg, section), leaf)
            specs = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
            for spec in specs:
                target = spec.rpartition(":")[0] if isinstance(spec, str) else ""
                if target.endswith(".py") and os.path.isabs(target) and not os.path.isfile(target):
                    raise ConfigError(f"{describe(cfg, key)}: {target} does not exist. {RULE}.")


def shown(path: str | os.PathLike) -> str:
    """A path as a user would type it from here: relative to the working directory when inside it."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    rel = os.path.relpath(text)
    return text if rel == ".." or rel.startswith(".." + os.sep) else rel


def same_path(old: Any, new: Any) -> bool:
    """A value in a run folder's config.yaml written before paths were stored absolute (``../models/m``,
    ``rewards.py:fn``) and the same value stored absolute now: the same path when the absolute one ends
    with the relative one (its leading ``./`` and ``../`` removed)."""
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(same_path(a, b) for a, b in zip(old, new))
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(same_path(old[k], new[k]) for k in old)
    if not isinstance(old, str) or not isinstance(new, str):
        return old == new
    if old == new:
        return True
    if os.path.isabs(old) or not os.path.isabs(new.rpartition(":")[0] or new):
        return False
    tail = re.sub(r"^(\.\.?/)+", "", old.replace("\\", "/"))
    return bool(tail) and new.replace("\\", "/").endswith("/" + tail)
