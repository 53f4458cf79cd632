"""List what TRL's GRPO tests touch on GRPOTrainer / GRPOConfig, by reading the test file's syntax tree.

For each test function it records:
  * attributes read, called or assigned on a trainer instance (``trainer.x``; for ``state``, ``args``, ``model``
    and a few other containers the second level too, e.g. ``trainer.state.log_history``);
  * attributes used on the class itself (``GRPOTrainer.x``) and names patched with ``patch.object``;
  * GRPOTrainer constructor keywords and GRPOConfig keywords;
  * metric keys read from ``trainer.state.log_history`` entries and ``evaluate()`` results;
  * keyword arguments that reward functions read (``kwargs.get("...")``) and logger names used with caplog.

Counts are given in test functions and in collected test cases (parametrized cases counted one by one, from a
harness summary.json, or from pytest --collect-only output if none is given).

Usage: python -m benchmarks.trl_tests.touched TEST_FILE [--summary results/trl/summary.json] [--json out.json]
       [--md out.md]
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

SECOND_LEVEL = {"state", "args", "model", "accelerator", "ref_model", "liger_loss", "vllm_generation", "_logs",
                "_metrics", "processing_class", "_tokenizer", "reward_funcs", "environments", "eval_dataset"}  # fmt: skip
METRIC_CONTAINERS = ("log_history", "metrics", "log")


def dotted(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return list(reversed(parts))
    return None


class TestVisitor(ast.NodeVisitor):
    def __init__(self, helper_info):
        self.trainer_names = {"trainer"}
        self.helper_info = helper_info
        self.touch = defaultdict(set)  # name -> kinds {"read","call","write"}
        self.class_attrs = set()
        self.patched = set()
        self.ctor_kwargs = set()
        self.config_kwargs = set()
        self.metric_keys = set()
        self.reward_kwargs = set()
        self.loggers = set()
        self.helpers_used = set()
        self.external_patches = set()
        self.raises = set()

    # --- trainer instance discovery
    def visit_Assign(self, node):
        value = node.value
        is_trainer = False
        if isinstance(value, ast.Call):
            fn = dotted(value.func) or []
            if fn[-1:] == ["GRPOTrainer"]:
                is_trainer = True
            elif fn == ["object", "__new__"] and value.args and dotted(value.args[0]) == ["GRPOTrainer"]:
                is_trainer = True
            elif fn[-1:] in (["Mock"], ["MagicMock"]) and any(
                kw.arg == "spec" and dotted(kw.value) == ["GRPOTrainer"] for kw in value.keywords
            ):
                is_trainer = True
            elif fn[:1] == ["self"] and fn[-1] in self.helper_info:
                self.helpers_used.add(fn[-1])
                is_trainer = self.helper_info[fn[-1]].get("returns_trainer", False)
        if is_trainer:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.trainer_names.add(target.id)
        for target in node.targets:
            self._record_target(target)
        self.generic_visit(node)

    def _record_target(self, target):
        chain = dotted(target) if isinstance(target, ast.Attribute) else None
        if chain and chain[0] in self.trainer_names and len(chain) > 1:
            self.touch[self._key(chain)].add("write")

    def _key(self, chain):
        rest = chain[1:]
        if len(rest) >= 2 and rest[0] in SECOND_LEVEL:
            return ".".join(rest[:2])
        return rest[0]

    def visit_Attribute(self, node):
        chain = dotted(node)
        if chain:
            if chain[0] in self.trainer_names and len(chain) > 1:
                self.touch[self._key(chain)].add("read")
            elif chain[0] == "GRPOTrainer" and len(chain) > 1:
                self.class_attrs.add(chain[1])
            elif chain[:2] == ["self", "trainer"] and len(chain) > 2:
                self.touch[self._key(chain[1:])].add("read")
        self.generic_visit(node)

    def visit_Call(self, node):
        fn = dotted(node.func) or []
        if len(fn) >= 2 and fn[0] in self.trainer_names:
            self.touch[self._key(fn)].add("call")
        if fn[-1:] == ["GRPOTrainer"]:
            self.ctor_kwargs.update(kw.arg for kw in node.keywords if kw.arg)
        if fn[-1:] == ["GRPOConfig"]:
            self.config_kwargs.update(kw.arg for kw in node.keywords if kw.arg)
        if fn[-2:] == ["patch", "object"] and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            owner = dotted(node.args[0]) or ["?"]
            if owner[0] in self.trainer_names:
                owner = ["trainer", *owner[1:]]
            self.patched.add(".".join(owner) + "." + node.args[1].value)
        if fn[-1:] == ["get"] and len(fn) >= 2 and fn[-2] == "kwargs" and node.args:
            if isinstance(node.args[0], ast.Constant):
                self.reward_kwargs.add(node.args[0].value)
        if fn[-2:] == ["pytest", "raises"] and node.args:
            exc = ast.unparse(node.args[0])
            match = next((ast.unparse(kw.value) for kw in node.keywords if kw.arg == "match"), None)
            self.raises.add(f"{exc}, match={match}" if match else exc)
        if fn[-1:] == ["at_level"]:
            for kw in node.keywords:
                if kw.arg == "logger" and isinstance(kw.value, ast.Constant):
                    self.loggers.add(kw.value.value)
        if fn[:1] == ["self"] and len(fn) == 2 and fn[1] in self.helper_info:
            self.helpers_used.add(fn[1])
        self.generic_visit(node)

    def visit_Subscript(self, node):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            src = ast.unparse(node.value)
            if any(c in src for c in METRIC_CONTAINERS):
                self.metric_keys.add(key.value)
        self.generic_visit(node)

    def visit_Compare(self, node):
        # "key" in trainer.state.log_history[-1]
        if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
            for op, comp in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, (ast.In, ast.NotIn)) and any(c in ast.unparse(comp) for c in METRIC_CONTAINERS):
                    self.metric_keys.add(node.left.value)
        self.generic_visit(node)


def analyse(path: Path):
    tree = ast.parse(path.read_text())
    results = {}
    external = defaultdict(set)
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        helpers = {}
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("test_"):
                v = TestVisitor({})
                v.visit(fn)
                returns_trainer = any(
                    isinstance(n, ast.Return) and isinstance(n.value, ast.Name) and n.value.id in v.trainer_names
                    for n in ast.walk(fn)
                )
                helpers[fn.name] = {"visitor": v, "returns_trainer": returns_trainer}
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
                continue
            v = TestVisitor(helpers)
            v.visit(fn)
            for deco in fn.decorator_list:
                if isinstance(deco, ast.Call) and (dotted(deco.func) or [])[-1:] == ["patch"] and deco.args:
                    if isinstance(deco.args[0], ast.Constant):
                        v.external_patches.add(deco.args[0].value)
            for name in v.helpers_used:
                h = helpers[name]["visitor"]
                for k, kinds in h.touch.items():
                    v.touch[k] |= kinds
                v.class_attrs |= h.class_attrs
                v.patched |= h.patched
                v.config_kwargs |= h.config_kwargs
                v.ctor_kwargs |= h.ctor_kwargs
            results[f"{cls.name}::{fn.name}"] = v
            for p in v.external_patches:
                external[p].add(f"{cls.name}::{fn.name}")
    return results, external


def item_counts(summary: Path | None, functions) -> dict[str, int]:
    counts = defaultdict(int)
    if summary and summary.is_file():
        for nodeid in json.loads(summary.read_text())["tests"]:
            _, cls, name = nodeid.split("::")
            counts[f"{cls}::{name.split('[')[0]}"] += 1
    for f in functions:
        counts.setdefault(f, 1)
    return counts


def build_report(results, external, counts):
    def tally(getter):
        table = defaultdict(lambda: {"functions": 0, "cases": 0, "kinds": set(), "tests": []})
        for test, v in results.items():
            for name, kinds in getter(v):
                row = table[name]
                row["functions"] += 1
                row["cases"] += counts[test]
                row["kinds"] |= set(kinds)
                row["tests"].append(test)
        return {k: {**r, "kinds": sorted(r["kinds"])} for k, r in sorted(table.items())}

    return {
        "trainer_attributes": tally(lambda v: v.touch.items()),
        "class_attributes": tally(lambda v: [(a, ["class"]) for a in v.class_attrs]),
        "patched": tally(lambda v: [(p, ["patch"]) for p in v.patched]),
        "constructor_kwargs": tally(lambda v: [(a, ["ctor"]) for a in v.ctor_kwargs]),
        "config_kwargs": tally(lambda v: [(a, ["config"]) for a in v.config_kwargs]),
        "metric_keys": tally(lambda v: [(a, ["metric"]) for a in v.metric_keys]),
        "reward_func_kwargs": tally(lambda v: [(a, ["kwarg"]) for a in v.reward_kwargs]),
        "loggers": tally(lambda v: [(a, ["logger"]) for a in v.loggers]),
        "raises": tally(lambda v: [(a, ["raises"]) for a in v.raises]),
        "external_patches": {k: sorted(v) for k, v in external.items()},
        "tests_touching_private": sorted(
            t
            for t, v in results.items()
            if any(k.split(".")[-1].startswith("_") or k.startswith("_") for k in v.touch)
            or any(a.startswith("_") for a in v.class_attrs)
            or any(p.split(".")[-1].startswith("_") for p in v.patched)
        ),
        "cases_per_function": dict(counts),
    }


def render_md(report) -> str:
    lines = ["# GRPOTrainer / GRPOConfig surface used by TRL's GRPO tests", ""]

    def section(title, key, show_kinds=True):
        rows = report[key]
        lines.append(f"## {title} ({len(rows)})")
        lines.append("")
        lines.append("| name | test functions | test cases |" + (" how |" if show_kinds else ""))
        lines.append("|---|---:|---:|" + ("---|" if show_kinds else ""))
        for name, r in sorted(rows.items(), key=lambda kv: (-kv[1]["cases"], kv[0])):
            private = " (private)" if name.split(".")[-1].startswith("_") or name.startswith("_") else ""
            kinds = f" {', '.join(r['kinds'])} |" if show_kinds else ""
            lines.append(f"| `{name}`{private} | {r['functions']} | {r['cases']} |{kinds}")
        lines.append("")

    section("Trainer instance attributes (read / call / write)", "trainer_attributes")
    section("Class attributes used without an instance", "class_attributes", False)
    section("Attributes replaced with patch.object", "patched", False)
    section("GRPOTrainer constructor keywords", "constructor_kwargs", False)
    section("GRPOConfig keywords", "config_kwargs", False)
    section("Metric keys read from log_history / evaluate()", "metric_keys", False)
    section("Keyword arguments reward functions read", "reward_func_kwargs", False)
    section("Loggers checked with caplog", "loggers", False)
    section("Errors expected with pytest.raises (exception, message pattern)", "raises", False)
    lines.append("## Library functions patched by decorators")
    lines.append("")
    for k, tests in report["external_patches"].items():
        lines.append(f"- `{k}`: {', '.join(tests)}")
    lines.append("")
    lines.append(f"## Tests that touch private (underscore) trainer members ({len(report['tests_touching_private'])})")
    lines.append("")
    for t in report["tests_touching_private"]:
        lines.append(f"- {t}")
    lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test_file", type=Path)
    ap.add_argument("--summary", type=Path, help="harness summary.json, for parametrized case counts")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    results, external = analyse(args.test_file)
    counts = item_counts(args.summary, results)
    report = build_report(results, external, counts)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    md = render_md(report)
    if args.md:
        args.md.write_text(md)
    else:
        print(md)


if __name__ == "__main__":
    main()
