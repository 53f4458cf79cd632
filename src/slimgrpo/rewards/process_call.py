"""How ``rewards.isolation=process`` starts its child: ``fork`` while this process has not touched CUDA,
``spawn`` once it has.

A forked copy of a process that holds a CUDA context inherits the driver's state and threads in an undefined
condition: a reward that touches CUDA there fails ("Cannot re-initialize CUDA in forked subprocess"), and
even one that does not can hang on a lock some driver thread held at the fork. A spawned child is a fresh
interpreter, so what it runs travels by pickle: the function by reference (its module and name) and the
inputs by value. Functions loaded from a file (``path/to/rewards.py:fn``) live in a module that only this
process has registered (``rewards/loading.py``), so the child re-runs that file under the same module
name before it unpickles the call. A function that cannot travel that way (a lambda, a closure) is refused
with the reason, as a fault of that call; on CPU runs nothing changes (fork, as before).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import pickle
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

USER_MODULE_PREFIX = "slimgrpo_user_rewards."  # rewards/loading.py registers reward files under this prefix


def start_method() -> str:
    """``spawn`` once CUDA is initialised in this process, else ``fork`` (cheap; the function and its
    inputs need not be picklable)."""
    import torch

    return "spawn" if torch.cuda.is_initialized() else "fork"


def user_modules(fn: Callable) -> list[tuple[str, str]]:
    """``(module name, file)`` of the reward files ``fn`` needs re-run in a spawned child: its own module
    when ``rewards/loading.py`` loaded it from a path (the parent packages are namespaces made on the fly)."""
    name = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "")
    module = sys.modules.get(name)
    if name.startswith(USER_MODULE_PREFIX) and module is not None and getattr(module, "__file__", None):
        return [(name, module.__file__)]
    return []


def pack_call(fn: Callable, kwargs: dict) -> bytes:
    """The call as bytes for a spawned child; ``TypeError`` naming what cannot travel. A function of a
    reward file travels as ``(module name, qualified name)``: pickle cannot import that module by name."""
    modules = user_modules(fn)
    ref: Any = ("user-module", modules[0][0], fn.__qualname__) if modules and hasattr(fn, "__qualname__") else fn
    try:
        return pickle.dumps((ref, kwargs))
    except Exception as e:  # PicklingError, AttributeError (local objects), TypeError
        raise TypeError(
            f"rewards.isolation=process after CUDA started runs the function in a fresh (spawned) process, so "
            f"the function and its inputs must be picklable ({type(e).__name__}: {e}). Define the reward "
            "function at the top level of a module or file (no lambda or closure), or use "
            "rewards.isolation=thread") from None


def _resolve(ref: Any) -> Callable:
    if isinstance(ref, tuple) and len(ref) == 3 and ref[0] == "user-module":
        target: Any = sys.modules[ref[1]]
        for part in ref[2].split("."):
            target = getattr(target, part)
        return target
    return ref


def _load_user_module(name: str, file: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the reward file {file!r} in the reward process")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(Path(file).parent))  # the file's own imports of its neighbours, as in loading.py
    spec.loader.exec_module(module)


def spawned_child_main(conn, modules: list[tuple[str, str]], payload: bytes, child_main: Callable) -> None:
    """Entry point of a spawned reward child: re-run the reward files, unpickle the call, then run it as
    the forked child does (``child_main(conn, fn, kwargs)``)."""
    try:
        for name, file in modules:
            _load_user_module(name, file)
        ref, kwargs = pickle.loads(payload)  # noqa: S301 - bytes made by this run's own parent process
        fn = _resolve(ref)
    except BaseException:
        conn.send(("error", traceback.format_exc(limit=-3)))
        conn.close()
        return
    child_main(conn, fn, kwargs)


def start_child(target: Callable, fn: Callable, kwargs: dict) -> tuple[Any, Any]:
    """Start the reward child: ``(process, parent end of its pipe)``. ``target(conn, fn, kwargs)`` is the
    child's work (``rewards/scoring.py``'s ``_child_main``); under spawn it is reached through
    :func:`spawned_child_main`. Raises ``TypeError`` when the call cannot be sent to a spawned child."""
    method = start_method()
    if method == "spawn":
        args = (user_modules(fn), pack_call(fn, kwargs), target)
        entry: Callable = spawned_child_main
    else:
        args, entry = (fn, kwargs), target
    context = multiprocessing.get_context(method)
    parent_conn, child_conn = context.Pipe(duplex=False)
    child = context.Process(target=entry, args=(child_conn, *args), daemon=True)
    child.start()
    child_conn.close()
    return child, parent_conn
