"""Finding reward functions from the strings written in a config.

A spec is one of:

* a built-in name: ``gsm8k_accuracy`` (see ``BUILTIN_REWARDS``);
* an importable module and a function: ``my_package.rewards:correctness`` (``Class.method`` works too);
* a Python file and a function: ``rewards.py:correctness`` or ``../shared/rewards.py:correctness``;
  a relative path is taken from ``base_dir`` (pass the folder of the config file), else the
  current directory;
* a model folder (``config.json`` inside) of a sequence-classification reward model, as TRL takes one
  (see ``slimgrpo.rewards.reward_model``); from Python also a model object or any callable.

Loading a file or module **executes its code** in this process, with your permissions: that is the
point (it is your reward code), so only point specs at code you trust. The file's folder is put on
``sys.path`` while it loads, so it can import helper modules lying beside it. A file is loaded once
per process; several functions from one file share its module.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from slimgrpo.rewards.builtin import BUILTIN_REWARDS

__all__ = ["RewardSpecError", "RewardFileNotFoundError", "load_reward_function", "load_reward_functions", "reward_label"]


class RewardSpecError(ValueError):
    """A reward function spec names something that does not exist or cannot be used."""


class RewardFileNotFoundError(RewardSpecError, FileNotFoundError):
    """The file of a ``path/to/file.py:function`` spec does not exist."""


def load_reward_function(
    spec: str | Callable, base_dir: str | os.PathLike | None = None, device: str | None = "auto"
) -> tuple[str, Callable]:
    """Resolve ``spec`` to ``(display_name, function)``; the display name is used for metrics.

    ``spec`` is a built-in name (display name: that name), ``module.path:function`` or
    ``path/to/file.py:function`` (display name: the function's name). A callable is accepted as is
    (display name: its ``__name__``). Raises ``RewardSpecError`` (a ``ValueError``) with a hint for
    unknown names, and ``RewardFileNotFoundError`` for a missing file.
    """
    from slimgrpo.rewards.reward_model import RewardModel, is_model_folder

    if hasattr(spec, "config") and hasattr(spec, "forward"):  # a model object (TRL: PreTrainedModel)
        model = RewardModel(spec, device=device)
        return model.__name__, model
    if callable(spec):
        return reward_label(spec), spec
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(f"load_reward_function: expected a name or 'module:function', got {spec!r}")
    spec = spec.strip()
    if ":" not in spec or os.path.isdir(spec):
        folder = spec if os.path.isabs(spec) or base_dir is None else os.path.join(base_dir, spec)
        for candidate in (folder, spec):
            if is_model_folder(candidate):
                model = RewardModel(candidate, device=device)
                return model.__name__, model
    if ":" not in spec:
        if spec.endswith(".py") or "/" in spec or "\\" in spec:
            raise RewardSpecError(_file_without_function(spec, base_dir))
        return spec, _builtin(spec)
    target, attribute = spec.rsplit(":", 1)
    if not attribute:
        raise RewardSpecError(f"reward spec {spec!r} has no function name after ':'")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(target, base_dir, spec)
        label = str(module.__file__)
    else:
        module = _import_module(target, spec)
        label = target
    function = _get_attribute(module, attribute, spec, label)
    return attribute.rsplit(".", 1)[-1], function


def reward_label(spec: Any) -> str:
    """A reward as a person reads it: a spec as written, a function given from Python by its ``__name__`` (a
    callable object without one, such as a ``functools.partial``, by its type's name)."""
    if isinstance(spec, str):
        return spec
    return getattr(spec, "__name__", type(spec).__name__)


def load_reward_functions(
    specs: Sequence[str | Callable], base_dir: str | os.PathLike | None = None, device: str | None = "auto"
) -> list[tuple[str, Callable]]:
    """Load several specs; repeated display names get a suffix (``correctness``, ``correctness_2``)."""
    loaded: list[tuple[str, Callable]] = []
    seen: dict[str, int] = {}
    for spec in specs:
        name, function = load_reward_function(spec, base_dir, device)
        seen[name] = seen.get(name, 0) + 1
        loaded.append((name if seen[name] == 1 else f"{name}_{seen[name]}", function))
    return loaded


def _file_without_function(spec: str, base_dir: str | os.PathLike | None) -> str:
    """``rewards.py`` alone: say how to name the function, listing the file's top-level functions (read
    with ``ast``, without running the file)."""
    import ast

    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (Path(base_dir) if base_dir is not None else Path.cwd()) / path
    names: list[str] = []
    try:
        tree = ast.parse(path.read_text(encoding="utf-8-sig"))
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and not n.name.startswith("_")]
    except (OSError, SyntaxError, ValueError):
        pass
    example = f"{spec}:{names[0] if names else 'function_name'}"
    found = f" Functions in that file: {', '.join(names)}." if names else ""
    return (f"reward spec {spec!r} names a file but not the function in it: write {example!r} "
            f"(file:function).{found}")


def _builtin(name: str) -> Callable:
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    close = difflib.get_close_matches(name, list(BUILTIN_REWARDS), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    dotted = ""
    if "." in name:
        module, _, function = name.rpartition(".")
        dotted = f" To load your own function write 'module:function', e.g. '{module}:{function}'."
    raise RewardSpecError(
        f"unknown built-in reward function {name!r}.{hint}{dotted} "
        f"Built-ins: {', '.join(sorted(BUILTIN_REWARDS))}; or use 'path/to/file.py:function'."
    )


def _load_file(target: str, base_dir: str | os.PathLike | None, spec: str) -> ModuleType:
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = base / path
    path = path.resolve()
    if not path.is_file():
        raise RewardFileNotFoundError(
            f"reward spec {spec!r}: file {str(path)!r} does not exist "
            f"(relative paths are taken from {str(base)!r}, the config file's folder)"
        )
    module_name = f"slimgrpo_user_rewards.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise RewardSpecError(f"reward spec {spec!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RewardSpecError(
            f"reward spec {spec!r}: running {str(path)!r} failed with {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    return module


def _import_module(target: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise RewardSpecError(
                f"reward spec {spec!r}: no module named {exc.name!r} (is it installed or on PYTHONPATH? "
                f"For a file write 'path/to/{target.replace('.', '/')}.py:function')"
            ) from exc
        raise RewardSpecError(f"reward spec {spec!r}: importing {target!r} failed: {exc}") from exc
    except Exception as exc:
        raise RewardSpecError(
            f"reward spec {spec!r}: importing {target!r} failed with {type(exc).__name__}: {exc}"
        ) from exc


def _get_attribute(module: ModuleType, attribute: str, spec: str, label: str) -> Callable:
    obj: object = module
    for depth, part in enumerate(attribute.split(".")):
        if not hasattr(obj, part):
            available = _public_callables(obj)
            close = difflib.get_close_matches(part, available, n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            shown = ", ".join(available[:30]) + (" ..." if len(available) > 30 else "")
            owner = label if depth == 0 else getattr(obj, "__name__", repr(obj))
            raise RewardSpecError(
                f"reward spec {spec!r}: {owner!r} has no attribute "
                f"{part!r}.{hint} Callables there: {shown or '(none)'}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardSpecError(
            f"reward spec {spec!r}: {attribute!r} is a {type(obj).__name__}, not a function; "
            "a reward function is called as fn(prompts, completions, completion_ids=..., **columns)"
        )
    return obj


def _public_callables(obj: object) -> list[str]:
    """Public callables of a module or class, preferring those defined there over imported ones."""
    members = {n: v for n, v in getattr(obj, "__dict__", {}).items() if callable(v) and not n.startswith("_")}
    own_module = getattr(obj, "__name__", None) if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    defined = [n for n, v in members.items() if getattr(v, "__module__", None) == own_module]
    return sorted(defined or members)
