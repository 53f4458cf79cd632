"""pytest plugin for running TRL's GRPO tests offline against TRL or against slimgrpo's drop-in classes.

Loaded with ``-p benchmarks.trl_tests.plugin`` (run.sh runs pytest with the repository root and slimgrpo's
``src`` on PYTHONPATH). It

* selects the trainer under test (``--harness-target trl|slimgrpo``, default from $HARNESS_TARGET): for
  ``slimgrpo`` it binds ``GRPOTrainer`` / ``GRPOConfig`` to ``slimgrpo.trl``'s classes (taken through
  ``benchmarks.surface`` as ``TrlGRPOTrainer`` / ``TrlGRPOConfig``), both on the ``trl`` package (before the test
  module imports them) and in every collected test module's globals (after import);
* adds names that the pinned test-support file imports but the installed TRL release no longer has (a shim, listed
  in the summary), so that the test files stay byte-identical to TRL's;
* classifies every collected test (parametrized cases one by one) by what it needs: GPU, vLLM, DeepSpeed, Liger,
  other optional packages, skipped outright by TRL, or applicable on this CPU;
* records each test's outcome and writes ``summary.json`` and ``summary.txt`` into $HARNESS_OUT.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import re
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

_STATE = {
    "target": None,
    "shims": [],
    "items": {},
    "outcomes": {},
    "start": None,
}

# Order matters: the first category that matches is a test's primary category.
CATEGORIES = [
    ("gpu", "needs a GPU / accelerator"),
    ("vllm", "needs vLLM (library or server)"),
    ("deepspeed", "needs DeepSpeed"),
    ("liger", "needs Liger kernels (liger-kernel, GPU)"),
    ("optional", "needs another optional package"),
    ("trl_skip", "skipped outright by TRL"),
    ("cpu", "applicable on this CPU"),
]

# Optional packages whose requirement markers can be met on this CPU machine when installed.
CPU_CAPABLE_PACKAGES = {"jmespath", "peft", "vision", "math_verify", "rich", "sklearn"}


def pytest_addoption(parser):
    group = parser.getgroup("harness")
    group.addoption(
        "--harness-target",
        choices=["trl", "slimgrpo"],
        default=os.environ.get("HARNESS_TARGET", "trl"),
        help="trainer classes under test",
    )


def _add_compat_shims():
    """Names the pinned test-support files import from TRL that this TRL release does not define."""
    import trl.import_utils as iu

    if not hasattr(iu, "is_joblib_available"):

        def is_joblib_available() -> bool:
            return importlib.util.find_spec("joblib") is not None

        iu.is_joblib_available = is_joblib_available
        _STATE["shims"].append("trl.import_utils.is_joblib_available (removed after the pinned test revision)")


def _allow_cpu_bf16():
    """TRL's configs default to ``bf16=True``; on a machine without an accelerator transformers then refuses to
    build the arguments ("Your setup doesn't support bf16/gpu") unless ``use_cpu`` is set, which the tests never do
    (TRL runs them on GPU runners). The CPU runs bf16 autocast fine, so on a machine with no accelerator the
    capability probe that ``TrainingArguments`` consults is answered by the CPU. With a GPU present nothing changes."""
    import torch
    import transformers.training_args as ta

    if torch.cuda.is_available() or getattr(torch, "xpu", None) and torch.xpu.is_available():
        return
    if ta.is_torch_bf16_gpu_available():
        return
    ta.is_torch_bf16_gpu_available = lambda: True
    _STATE["shims"].append(
        "transformers.training_args.is_torch_bf16_gpu_available -> True (no accelerator; bf16 autocast runs on the CPU)"
    )


def _bind_slimgrpo():
    try:
        from benchmarks.surface import TrlGRPOConfig, TrlGRPOTrainer
    except Exception as exc:  # one clear line, then stop before collecting anything
        pytest.exit(
            f"harness: target 'slimgrpo' needs slimgrpo.trl, which cannot be imported ({type(exc).__name__}: {exc})",
            returncode=3,
        )
    import slimgrpo
    import trl

    _STATE["slimgrpo_from"] = str(Path(slimgrpo.__file__).resolve().parents[1])
    replacements = {"GRPOTrainer": TrlGRPOTrainer, "GRPOConfig": TrlGRPOConfig}
    for module_name in ("trl", "trl.trainer"):
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        for name, obj in replacements.items():
            setattr(module, name, obj)
    _STATE["replacements"] = replacements
    _STATE["trl_version"] = trl.__version__


def pytest_configure(config):
    _STATE["target"] = config.getoption("--harness-target")
    _STATE["start"] = time.time()
    config.addinivalue_line("markers", "slow: TRL's slow tests")
    config.addinivalue_line("markers", "low_priority: TRL's low-priority tests")
    _add_compat_shims()
    _allow_cpu_bf16()
    if _STATE["target"] == "slimgrpo":
        _bind_slimgrpo()


def _reason_kind(reason: str) -> tuple[str, str] | None:
    """Map a TRL skip / requirement reason to (category, package or detail)."""
    r = reason.lower()
    if "accelerator" in r or "cuda" in r or "gpu" in r:
        return "gpu", reason
    if "vllm" in r:
        return "vllm", reason
    if "deepspeed" in r:
        return "deepspeed", reason
    if "liger" in r:
        return "liger", reason
    if r.startswith("test requires "):
        package = r[len("test requires ") :].split()[0].replace("-", "_")
        return "optional", package
    return None


def _classify(item) -> dict:
    needs = []  # (category, detail, satisfied_here)
    trl_skip = None
    for mark in item.iter_markers():
        if mark.name == "skipif":
            condition = mark.args[0] if mark.args else mark.kwargs.get("condition")
            reason = mark.kwargs.get("reason", "")
            kind = _reason_kind(reason)
            if kind is not None:
                needs.append((kind[0], kind[1], not bool(condition)))
            elif condition:
                needs.append(("version", reason, False))
        elif mark.name == "skip":
            trl_skip = mark.kwargs.get("reason", mark.args[0] if mark.args else "")
        elif mark.name == "slow":
            needs.append(("slow", "marked slow", True))
    # A test also needs whatever its own skip reason talks about (e.g. "a mock for the vLLM server").
    if trl_skip and "vllm" in trl_skip.lower():
        needs.append(("vllm", trl_skip, False))
    categories = set()
    for cat, detail, satisfied in needs:
        if cat in ("gpu", "vllm", "deepspeed", "liger"):
            categories.add(cat)
        elif cat == "optional" and detail not in CPU_CAPABLE_PACKAGES:
            categories.add("optional")
        elif cat == "version" and not satisfied:
            categories.add("optional")
    if trl_skip:
        categories.add("trl_skip")
    primary = next((c for c, _ in CATEGORIES if c in categories), "cpu")
    return {
        "primary": primary,
        "categories": sorted(categories),
        "requires": sorted({detail for cat, detail, _ in needs if cat == "optional"}),
        "reasons": sorted({detail for cat, detail, _ in needs if cat not in ("optional", "slow")}),
        "trl_skip": trl_skip,
    }


def _manifest() -> dict:
    path = Path(os.environ.get("HF_HOME", "")) / "standins.json"
    return json.loads(path.read_text()) if path.is_file() else {}


_HUB_ID = re.compile(r'"([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)"')


def _hub_ids(item) -> list[str]:
    """Hub ids a test loads: its parameters plus the string literals of its body."""
    ids = set()
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        ids.update(v for v in callspec.params.values() if isinstance(v, str) and "/" in v)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(item.function)))
    except (OSError, TypeError, SyntaxError):
        return sorted(ids)
    func = tree.body[0]
    body = ast.Module(body=getattr(func, "body", []), type_ignores=[])  # not the decorators' parameter lists
    for node in ast.walk(body):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _HUB_ID.fullmatch(f'"{node.value}"'):
            if not node.value.startswith(("rewards/", "tools/", "completions/")):
                ids.add(node.value)
    return sorted(ids)


def pytest_collection_finish(session):
    items = session.items  # final list, after -k / -m deselection
    manifest = _manifest()
    needs_tv = set(manifest.get("needs_torchvision", []))
    if _STATE["target"] == "slimgrpo":
        modules = {item.module for item in items if getattr(item, "module", None) is not None}
        for module in modules:
            for name, obj in _STATE["replacements"].items():
                if name in vars(module):
                    setattr(module, name, obj)
    for item in items:
        hub_ids = _hub_ids(item)
        blocked = sorted(set(hub_ids) & needs_tv)
        if blocked and importlib.util.find_spec("torchvision") is None:
            item.add_marker(
                pytest.mark.skipif(
                    True,
                    reason="test requires torchvision (harness: the processor of "
                    + ", ".join(blocked)
                    + " has a video processor; torchvision does not install beside the pinned torch CPU wheel)",
                )
            )
        info = _classify(item)
        info["hub_ids"] = hub_ids
        _STATE["items"][item.nodeid] = info


def pytest_runtest_logreport(report):
    rec = _STATE["outcomes"].setdefault(report.nodeid, {"outcome": None, "duration": 0.0, "message": None})
    rec["duration"] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
            rec["message"] = report.wasxfail
        elif report.skipped:
            outcome = "skipped"
            longrepr = report.longrepr
            rec["message"] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
            rec["message"] = _short_message(report)
        else:
            outcome = "passed"
        rec["outcome"] = outcome
    elif report.when == "teardown" and report.failed:
        rec["outcome"] = "error"
        rec["message"] = "teardown: " + (_short_message(report) or "")


def _short_message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0][:500] if crash.message else ""
    return str(report.longrepr).strip().splitlines()[-1][:500]


def pytest_runtest_logfinish(nodeid, location):
    # Keep summary.json current after every test, so an interrupted run still leaves its results.
    _write_summary(final=False)


def pytest_sessionfinish(session, exitstatus):
    _write_summary(final=True)


def _write_summary(final: bool):
    out = Path(os.environ.get("HARNESS_OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    wall = time.time() - (_STATE["start"] or time.time())
    tests = {}
    for nodeid, cls in _STATE["items"].items():
        rec = _STATE["outcomes"].get(nodeid, {"outcome": "not run", "duration": 0.0, "message": None})
        tests[nodeid] = {**cls, **rec}
    by_outcome = Counter(t["outcome"] for t in tests.values())
    by_category = defaultdict(Counter)
    for t in tests.values():
        by_category[t["primary"]][t["outcome"]] += 1
    summary = {
        "complete": final,
        "target": _STATE["target"],
        "trl_version": _trl_version(),
        "test_revision": _test_revision(),
        "slimgrpo_src": _STATE.get("slimgrpo_from"),
        "shims": _STATE["shims"],
        "wall_seconds": round(wall, 1),
        "collected": len(tests),
        "outcomes": dict(by_outcome),
        "by_category": {k: dict(v) for k, v in by_category.items()},
        "tests": tests,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if final:
        (out / "summary.txt").write_text(_render(summary))


def _test_revision() -> str | None:
    """``rev@commit`` of the TRL test files (the REVISION file fetch_tests.sh writes beside them)."""
    path = Path(os.environ.get("HARNESS_TESTS", ".")) / "REVISION"
    if not path.is_file():
        return None
    info = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return f"{info.get('rev')}@{info.get('commit', '')[:12]}"


def _trl_version():
    try:
        import trl

        return trl.__version__
    except Exception:  # pragma: no cover
        return None


def _render(summary) -> str:
    lines = [
        f"target: {summary['target']}   trl {summary['trl_version']}   tests {summary['test_revision']}   "
        f"wall {summary['wall_seconds']} s" + (f"   slimgrpo {summary['slimgrpo_src']}" if summary["slimgrpo_src"] else ""),
        f"collected: {summary['collected']}   " + "   ".join(f"{k}: {v}" for k, v in sorted(summary["outcomes"].items())),
    ]
    if summary["shims"]:
        lines.append("compat shims: " + "; ".join(summary["shims"]))
    lines.append("")
    lines.append("by category (primary):")
    for cat, label in CATEGORIES:
        counts = summary["by_category"].get(cat)
        if counts:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            lines.append(f"  {cat:10s} {sum(counts.values()):4d}  ({detail})  - {label}")
    problems = [(n, t) for n, t in summary["tests"].items() if t["outcome"] in ("failed", "error", "xpassed", "not run")]
    if problems:
        lines.append("")
        lines.append("failures / errors:")
        for nodeid, t in sorted(problems):
            lines.append(f"  {t['outcome'].upper():7s} {nodeid}")
            lines.append(f"          {t['message']}")
    lines.append("")
    return "\n".join(lines)
