"""The package's import graph has no circles and keeps its layers (docs/architecture.md).

The graph is read from the source with ``ast``; nothing is imported. What counts as an edge:

- every ``import`` statement anywhere in a module: at the top, inside a function (a lazy import that closes
  a circle is still a circle: it only moves the failure from import time to call time), inside ``try``;
- except imports under ``if TYPE_CHECKING:``, which never run;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module of the package, else to ``pkg``
  (its ``__init__``); ``import a.b.c`` is an edge to ``a.b.c``; relative imports are resolved;
- an import does not add edges to the parent packages it initialises on the way: a submodule importing a
  sibling through its package's ``__init__`` shows up as an edge to the ``__init__`` and is caught there.

Imports by string (``importlib.import_module(name)``) are not seen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "slimgrpo"

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
# Every package may import these; they import nothing from slimgrpo.
FOUNDATIONS = ("containers", "collectives", "causal_lm", "units", "redact", "threads", "model_gguf", "exit_codes",
               "families", "target")


COMMANDS = ("cli", "__main__", "commands", "demo")  # the top-level modules and packages that are commands


def is_command(module: str) -> bool:
    """Command-line entry points sit on top, outside the library's packages: a top-level ``cli``, ``__main__``,
    the ``commands`` package, the demo. A ``cli`` module inside a library package is library code to these rules
    (its imports must keep its package's row), so a command cannot import upward from a lower room."""
    parts = module.split(".")
    return len(parts) > 1 and parts[1] in COMMANDS


def module_names(src_root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``src_root/package``."""
    names: dict[str, Path] = {}
    for path in sorted((src_root / package).rglob("*.py")):
        parts = path.relative_to(src_root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom in the tree, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _base_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from ..x import y`` -> ``pkg.x``)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    here = parts if is_package else parts[:-1]  # the package the module lives in
    anchor = here[: len(here) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _module_imports(files: dict[str, Path]):
    """``(module, imported module, names imported from it)`` for every import statement of every module;
    names is None for ``import x``."""
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield name, alias.name, None
            else:
                yield name, _base_of(name, is_package, node), [alias.name for alias in node.names]


def import_graph(src_root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts)."""
    files = module_names(src_root, package)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, base, names in _module_imports(files):
        targets = [base] if names is None else [f"{base}.{n}" if f"{base}.{n}" in files else base for n in names]
        graph[name].update(t for t in targets if t in files and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete circle per strongly connected component of more than one module, as a path
    ``[a, b, ..., a]``. Tarjan's algorithm, iterative so deep graphs do not hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_circle_in(graph, set(c)) for c in components]


def _circle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth-first)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(component)}")


def _describe(cycles: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(c) for c in cycles)


def _bare(name: str) -> str:
    """``rollout/`` / ``data.py`` / ``config`` -> the top-level name."""
    name = name.strip().rstrip("/")
    return name[: -len(".py")] if name.endswith(".py") else name


def read_layers(text: str) -> dict[str, set[str]]:
    """The ``| package | owns | may import |`` table of docs/architecture.md: package -> what it may import."""
    rules: dict[str, set[str]] = {}
    rows = False
    for line in text.splitlines():
        if line.startswith("| package | owns | may import"):
            rows = True
        elif rows and not line.startswith("|"):
            break
        elif rows and not set(line) <= set("|- "):
            cells = line.strip().strip("|").split("|")
            allowed = {_bare(n) for n in re.findall(r"`([^`]+)`", cells[-1])}
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rules[_bare(name)] = allowed
    return rules


def layer_violations(graph: dict[str, set[str]], package: str, rules: dict[str, set[str]],
                     foundations: tuple[str, ...] = FOUNDATIONS) -> list[str]:
    """Imports that break the layers: a package importing one its row does not list (the foundations are
    always allowed, to everyone but themselves), or anything but a command importing a command."""
    found = []
    for module, targets in sorted(graph.items()):
        if module == package or is_command(module):
            continue
        home = module.split(".")[1]
        if home not in rules:
            found.append(f"{module}: {home!r} has no row in the layer table")
            continue
        allowed = rules[home] | {home} | (set() if home in foundations else set(foundations))
        for target in sorted(targets):
            if is_command(target):
                found.append(f"{module} imports {target}: only commands import commands")
            elif target.split(".")[1] not in allowed:
                found.append(f"{module} imports {target}: {home} may import only "
                             f"{', '.join(sorted(allowed - {home})) or 'nothing'}")
    return found



# --- parameter lists --------------------------------------------------------------------------------------

MAX_PARAMETERS = 8  # a function that needs more takes its config section or one typed settings object
# Functions over MAX_PARAMETERS today, with their count: each may shrink, none may grow, and no other joins
# them. The update stage (``update``) has none: it takes ``UpdateSettings``, derived from the config once.
# TRL's own signatures, kept so that a TRL script runs with its import changed (slimgrpo.trl): the drop-in's
# constructors take every argument TRL's take.
LONG_PARAMETER_LISTS: dict[str, int] = {
    "slimgrpo.trl.grpo:GRPOTrainer.__init__": 13,
    "slimgrpo.trl.ppo:PPOTrainer.__init__": 12,  # TRL 1.12's trl.experimental.ppo.PPOTrainer
}
NO_LONG_LISTS_UNDER = ("slimgrpo.update",)  # rooms held to MAX_PARAMETERS without exceptions


def parameter_counts(src_root: Path, package: str) -> dict[str, int]:
    """``module:Class.function`` -> its parameters (positional, keyword-only; ``self`` / ``cls`` and
    ``*args`` / ``**kwargs`` not counted), for every function and method of the package."""
    counts: dict[str, int] = {}

    def visit(module: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(module, child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                if prefix and names and names[0] in ("self", "cls"):
                    names = names[1:]
                counts[f"{module}:{prefix}{child.name}"] = len(names)
                visit(module, child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(module, child, prefix)

    for name, path in module_names(src_root, package).items():
        visit(name, ast.parse(path.read_text(), filename=str(path)), "")
    return counts


def long_parameter_lists(counts: dict[str, int], allowed: dict[str, int], strict: tuple[str, ...] = (),
                         limit: int = MAX_PARAMETERS) -> list[str]:
    """Functions over ``limit`` parameters that ``allowed`` does not list (or lists with fewer), or that
    sit in a ``strict`` package, where none is allowed."""
    found = []
    for name, n in sorted(counts.items()):
        module = name.split(":")[0]
        in_strict = any(module == s or module.startswith(s + ".") for s in strict)
        if n > limit and (in_strict or n > allowed.get(name, limit)):
            found.append(f"{name} takes {n} parameters (at most {limit if in_strict else allowed.get(name, limit)})")
    return found


def test_no_function_takes_a_longer_parameter_list():
    counts = parameter_counts(SRC, PACKAGE)
    problems = long_parameter_lists(counts, LONG_PARAMETER_LISTS, NO_LONG_LISTS_UNDER)
    assert not problems, ("pass the config section or a typed settings object instead:\n  "
                          + "\n  ".join(problems))
    shorter = [f"{k}: {counts.get(k, 'gone')}" for k, n in LONG_PARAMETER_LISTS.items() if counts.get(k, 0) < n]
    assert not shorter, f"shorter than LONG_PARAMETER_LISTS says (lower or drop the entry): {shorter}"


MAX_TRAINER_METHODS = 15  # the loop; the update, the checkpoints and the run's health are components


def test_the_trainer_keeps_to_the_loop():
    path = SRC / PACKAGE / "train" / "loop.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainLoop")
    methods = [n.name for n in loop.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(methods) <= MAX_TRAINER_METHODS, (f"TrainLoop has {len(methods)} methods (at most "
                                                 f"{MAX_TRAINER_METHODS}): {methods}")


def test_long_parameter_lists_are_found(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f(a, b, c, *args, d=1, **kw):\n    def inner(x):\n        pass\n"
                    "class K:\n    def m(self, a, b, c):\n        pass\n",
        "pkg/up/__init__.py": "",
        "pkg/up/b.py": "def g(a, b, c, d):\n    pass\n",
    })
    counts = parameter_counts(tmp_path, "pkg")
    assert counts == {"pkg.a:f": 4, "pkg.a:f.<locals>.inner": 1, "pkg.a:K.m": 3, "pkg.up.b:g": 4}
    assert long_parameter_lists(counts, {"pkg.a:f": 4}, limit=3) == ["pkg.up.b:g takes 4 parameters (at most 3)"]
    assert long_parameter_lists(counts, {"pkg.a:f": 3, "pkg.up.b:g": 4}, ("pkg.up",), limit=3) == [
        "pkg.a:f takes 4 parameters (at most 3)", "pkg.up.b:g takes 4 parameters (at most 3)"]


# --- the package itself -----------------------------------------------------------------------------------


def test_the_package_has_no_import_circles():
    cycles = find_cycles(import_graph(SRC, PACKAGE))
    assert not cycles, f"import circles in src/{PACKAGE} (lazy imports count too):\n{_describe(cycles)}"


def test_the_package_keeps_its_layers():
    rules = read_layers(DOC.read_text())
    assert all(rules.get(name) == set() for name in FOUNDATIONS), "the foundations' row must say 'nothing'"
    problems = layer_violations(import_graph(SRC, PACKAGE), PACKAGE, rules)
    assert not problems, "layers broken (the table in docs/architecture.md):\n  " + "\n  ".join(problems)


def test_the_graph_sees_the_package():
    graph = import_graph(SRC, PACKAGE)
    assert f"{PACKAGE}.rollout.engine" in graph[f"{PACKAGE}.evaluate"]  # a top-level import
    assert f"{PACKAGE}.modeling" in graph[f"{PACKAGE}.train.prompts"]  # one inside a function
    assert f"{PACKAGE}.rollout.cuda_graph" in graph[f"{PACKAGE}.rollout.decode"]  # `from . import cuda_graph`
    assert f"{PACKAGE}.plan.types" not in graph[f"{PACKAGE}.runspec.run"]  # under `if TYPE_CHECKING:`


# The training path: the stages a step runs and the build and loop that run them. None of them may reach the
# planner or its trace, by any chain of imports: the planner reads them from above.
TRAINING_PATH = ("rollout", "update", "forward", "loss", "modeling", "runspec", "advantage", "rewards", "data",
                 "agent", "checkpoint", "monitor", "output", "evaluate", "distributed", "memory",
                 "train.build", "train.loop", "train.step_metrics", "train.prompts", "train.seeding")
ABOVE_TRAINING = ("plan", "trace")


def reaching(graph: dict[str, set[str]], package: str, starts: tuple[str, ...], banned: tuple[str, ...]
             ) -> list[str]:
    """``module -> ... -> banned module`` for every module of ``starts`` (packages or modules, relative to
    ``package``) that reaches one of ``banned`` through the import graph, one shortest chain each."""
    def under(module: str, names: tuple[str, ...]) -> bool:
        rel = module[len(package) + 1:]
        return any(rel == n or rel.startswith(n + ".") for n in names)

    found = []
    for start in sorted(m for m in graph if under(m, starts)):
        parent, frontier = {start: ""}, [start]
        while frontier:
            following = []
            for node in frontier:
                for child in sorted(graph.get(node, ())):
                    if child in parent:
                        continue
                    parent[child] = node
                    if under(child, banned):
                        chain = [child]
                        while chain[-1] != start:
                            chain.append(parent[chain[-1]])
                        found.append(" -> ".join(reversed(chain)))
                        following = frontier = []
                        break
                    following.append(child)
                else:
                    continue
                break
            frontier = following
    return found


def test_training_stands_alone_below_the_planner():
    chains = reaching(import_graph(SRC, PACKAGE), PACKAGE, TRAINING_PATH, ABOVE_TRAINING)
    assert not chains, ("the training path reaches the planner (docs/architecture.md#the-house):\n  "
                        + "\n  ".join(chains))


def test_a_chain_to_the_planner_is_found(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/update/__init__.py": "",
        "pkg/update/a.py": "from pkg.spec import b\n",
        "pkg/spec/__init__.py": "",
        "pkg/spec/b.py": "def f():\n    from pkg.plan import c\n",
        "pkg/plan/__init__.py": "",
        "pkg/plan/c.py": "",
        "pkg/loss.py": "",
    })
    graph = import_graph(tmp_path, "pkg")
    assert reaching(graph, "pkg", ("update", "loss"), ("plan",)) == ["pkg.update.a -> pkg.spec.b -> pkg.plan.c"]


# --- the checker on planted packages ----------------------------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_lazy_circle_is_found(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import f\n",
        "pkg/sub/__init__.py": "",
        "pkg/b.py": "def f():\n    from .sub import c\n",
        "pkg/sub/c.py": "from .. import a\n",
        "pkg/leaf.py": "import os\nfrom pkg import a\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.sub.c"}  # `from .sub import c`: c is a submodule
    assert graph["pkg.sub.c"] == {"pkg.a"}  # `from .. import a` resolved
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a" in _describe(cycles)


def test_a_circle_through_a_package_init_is_found(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/config/__init__.py": "from pkg.config.parse import load\n",
        "pkg/config/parse.py": "def load():\n    import pkg.hints\n",
        "pkg/hints.py": "from pkg.config import load\n",
    })
    assert find_cycles(import_graph(tmp_path, "pkg")) == [
        ["pkg.config", "pkg.config.parse", "pkg.hints", "pkg.config"]]


def test_type_checking_imports_and_clean_packages_pass(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "from pkg import a\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "pkg/b.py": "from pkg.a import x\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == set()
    assert find_cycles(graph) == []


def test_layer_breaks_are_named(tmp_path):
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/cli.py": "",
        "pkg/rollout/__init__.py": "",
        "pkg/rollout/engine.py": "def main():\n    from pkg.cli import main\n",
        "pkg/config/__init__.py": "from pkg.rollout import engine\n",
        "pkg/units.py": "",
        "pkg/data.py": "import pkg.units\nfrom pkg.config import x\n",
        "pkg/report/__init__.py": "from .page import x\n",
        "pkg/report/page.py": "",
    })
    rules = read_layers(
        "| package | owns | may import |\n|---|---|---|\n| `units` | numbers | nothing |\n"
        "| `config/` | the tree | nothing here |\n| `data.py` | prompts | `config` |\n"
        "| `rollout/`, `report/` | generation; pages | `config`, `data` |\n\nafter the table: `units`\n")
    assert rules == {"units": set(), "config": set(), "data": {"config"}, "rollout": {"config", "data"},
                     "report": {"config", "data"}}
    problems = layer_violations(import_graph(tmp_path, "pkg"), "pkg", rules, foundations=("units",))
    assert problems == [
        "pkg.config imports pkg.rollout.engine: config may import only units",
        "pkg.rollout.engine imports pkg.cli: only commands import commands",
    ]


def test_a_command_inside_a_library_package_is_held_to_its_row(tmp_path):
    """A ``cli.py`` under ``memory/`` importing ``train`` is an arrow back up: the rules
    hold it to ``memory``'s row; the same import from ``commands/`` is a command's, allowed."""
    _plant(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/memory/__init__.py": "",
        "pkg/memory/planner.py": "",
        "pkg/memory/cli.py": "from pkg.train import trace\n",
        "pkg/train/__init__.py": "",
        "pkg/train/trace.py": "from pkg.memory import planner\n",
        "pkg/commands/__init__.py": "",
        "pkg/commands/plan.py": "from pkg.train import trace\nfrom pkg.memory import planner\n",
    })
    rules = read_layers("| package | owns | may import |\n|---|---|---|\n| `memory/` | plans | nothing |\n"
                        "| `train/` | the loop | `memory` |\n")
    assert layer_violations(import_graph(tmp_path, "pkg"), "pkg", rules, foundations=()) == [
        "pkg.memory.cli imports pkg.train.trace: memory may import only nothing"]


def test_commands_sit_outside_the_library_packages():
    """No ``cli`` module inside a library package: the commands are ``cli.py``, ``__main__.py``, ``commands/``
    and ``demo/``, so no library room holds an import of a room above it."""
    inside = [m for m in import_graph(SRC, PACKAGE) if m.split(".")[-1] == "cli" and not is_command(m)]
    assert not inside, f"commands inside library packages (move them to commands/): {inside}"


def dangling_imports(src_root: Path, package: str) -> list[str]:
    """Imports of ``package`` modules that do not exist (a module moved and an import left behind): the
    graph ignores them, so they would hide a broken edge."""
    files = module_names(src_root, package)
    return [f"{name} imports {target}, which does not exist" for name, target, _ in _module_imports(files)
            if (target == package or target.startswith(package + ".")) and target not in files]


def test_no_import_names_a_missing_module():
    problems = dangling_imports(SRC, PACKAGE)
    assert not problems, "\n  ".join(["dangling imports:", *problems])


def test_dangling_imports_are_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .gone import x\nfrom pkg.sub import a\n")
    assert dangling_imports(tmp_path, "pkg") == ["pkg.sub.a imports pkg.sub.gone, which does not exist"]
