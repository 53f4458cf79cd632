"""The benchmarks take slimgrpo through one declared surface (benchmarks/surface.py) and never edit the module
search path: every module of benchmarks/ read with ``ast`` (nothing imported), each offence named by file and
line. The last test imports the surface's names, so a name slimgrpo moves fails here, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SURFACE = BENCHMARKS / "surface.py"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(ROOT).as_posix(), ast.parse(p.read_text(), str(p)))
            for p in sorted(BENCHMARKS.rglob("*.py"))]


def _declared() -> dict[str, tuple[str, str]]:
    """SURFACE's table, read as the literal it is."""
    for node in ast.parse(SURFACE.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                      else None)
        if isinstance(target, ast.Name) and target.id == "SURFACE":
            return ast.literal_eval(node.value)
    raise AssertionError("benchmarks/surface.py has no SURFACE table")


def test_only_the_surface_imports_slimgrpo():
    """``import slimgrpo`` alone (its OpenMP wait policy, set before torch loads) is allowed anywhere; any other
    import of slimgrpo outside surface.py is not."""
    offences = []
    for path, tree in _modules():
        if path == "benchmarks/surface.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "slimgrpo":
                names = ", ".join(a.name for a in node.names)
                offences.append(f"{path}:{node.lineno}: from {node.module} import {names}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "slimgrpo" and (alias.name != "slimgrpo" or alias.asname):
                        offences.append(f"{path}:{node.lineno}: import {alias.name}"
                                        + (f" as {alias.asname}" if alias.asname else ""))
    assert not offences, ("benchmark modules import slimgrpo outside benchmarks/surface.py (take the name from "
                          "benchmarks.surface, declared there with its note):\n" + "\n".join(offences))


def test_no_module_touches_the_search_path():
    """No ``sys.path`` in benchmarks/, as code (``sys.path``, ``from sys import path``) or anywhere in a file's text:
    the package runs as ``python -m benchmarks....`` from the repository root, its children with PYTHONPATH."""
    offences = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                offences.append(f"{path}:{node.lineno}: sys.path")
            elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path"
                                                                                    for a in node.names):
                offences.append(f"{path}:{node.lineno}: from sys import path")
    for p in sorted(BENCHMARKS.rglob("*")):
        if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".txt"):
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if "sys.path" in line:
                    offences.append(f"{p.relative_to(ROOT).as_posix()}:{i}: {line.strip()}")
    assert not offences, "sys.path in benchmarks/:\n" + "\n".join(sorted(set(offences)))


def test_surface_names_are_declared_and_used():
    """Every name a benchmark takes from benchmarks.surface is in its table, with a note; every entry is used."""
    declared = _declared()
    notes = [name for name, (where, note) in declared.items() if not where.startswith("slimgrpo") or not note.strip()]
    assert not notes, f"surface entries without a slimgrpo module or a note: {notes}"
    used, unknown = set(), []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "benchmarks.surface":
                for alias in node.names:
                    used.add(alias.name)
                    if alias.name not in declared:
                        unknown.append(f"{path}:{node.lineno}: {alias.name}")
    assert not unknown, "names taken from benchmarks.surface that it does not declare:\n" + "\n".join(unknown)
    assert not set(declared) - used, f"declared on the surface, used by no benchmark: {sorted(set(declared) - used)}"


def test_every_surface_name_resolves():
    """Each name is where the table says it is (this imports slimgrpo: the one test here that does)."""
    import benchmarks.surface as surface

    missing = []
    for name in surface.__all__:
        try:
            getattr(surface, name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name} ({surface.SURFACE[name][0]}): {type(e).__name__}: {e}")
    assert not missing, "surface names slimgrpo no longer has where benchmarks/surface.py says:\n" + "\n".join(missing)
