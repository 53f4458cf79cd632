"""How a benchmark starts a process of its own: the command of a child (``python -m benchmarks.children.NAME``,
or any benchmark module by name) and its environment.

A child runs with the repository root as its working folder (``measure.run_measured`` and ``peak_rss_of`` start
it there) and ``PYTHONPATH`` naming the root and ``src/``: the benchmarks package comes from the root and slimgrpo
from this checkout's ``src/``, also under another virtualenv's interpreter (TRL 1.12's, vLLM's, the GPU
machine's), which has neither installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.harness.paths import REPO_ROOT


def module_command(module: str, *args: object, python: str | None = None) -> list[str]:
    """``[python, "-m", module, *args]``; ``python`` defaults to this interpreter."""
    return [python or sys.executable, "-m", module, *map(str, args)]


def child_command(name: str, *args: object, python: str | None = None) -> list[str]:
    """The command of ``benchmarks/children/NAME.py``."""
    return module_command(f"benchmarks.children.{name}", *args, python=python)


def child_env(*first: str | Path, inherit_pythonpath: bool = True, **extra: str) -> dict[str, str]:
    """This process's environment for a child: ``PYTHONPATH`` = ``first`` (folders searched before the checkout,
    e.g. a separately installed TRL), the repository root, its ``src/``, then the ``PYTHONPATH`` this process had
    (left out when not ``inherit_pythonpath``: another virtualenv must not see this one's folders); ``extra``
    variables set on top."""
    paths = [str(p) for p in first] + [str(REPO_ROOT), str(REPO_ROOT / "src")]
    old = os.environ.get("PYTHONPATH")
    if inherit_pythonpath and old:
        paths.append(old)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}
