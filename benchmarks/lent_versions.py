"""The project's fast suite under the lent GPU machine's library versions, on CPU (issue 56 item 8).

The lent machine's image (python3 3.12.3) has torch 2.11.0+cu130, transformers 5.17.0, tokenizers 0.23.2,
safetensors 0.8.0, accelerate 1.15.0, numpy 2.5.2 and huggingface_hub 1.33.0, older than the project's own
environment. This builds a virtual environment OUTSIDE the repository with those versions (each one a flag, so
the same script runs other versions: ``--torch 2.9.0 --peft 0.18.0``; pyproject.toml's floors are the versions it
passed with), plus the rest of slimgrpo's dependencies and its test extra from pyproject.toml, then runs
``pytest -m 'not slow'`` in it
against this checkout's ``src`` (through PYTHONPATH: nothing of slimgrpo is installed there), prints the versions
it ran and a summary, and writes a JSON record.

    python -m benchmarks.lent_versions                       # the lent machine's versions
    python -m benchmarks.lent_versions --torch 2.9.0 --peft 0.18.0      # other versions
    python -m benchmarks.lent_versions --reuse -- tests/memory   # the same environment, part of the suite

torch: the CPU build from ``--torch-index`` (download.pytorch.org's CPU index) when pip reaches it, else the
same version from the default index (on Linux, PyPI's CUDA build: it runs on CPU, and for 2.11.0 it is the lent
machine's own cu130 build), and the record says which. A pinned version pip cannot install for the interpreter
(numpy 2.5 needs Python 3.12) stops the run before the suite, naming it: pass another ``--python`` or version.

The environment is reused when ``--reuse`` is given and its marker file lists the same pins; otherwise it is built
anew (``--clear``). Default folder: ``$XDG_CACHE_HOME/slimgrpo/lent-versions/<pins>`` (``~/.cache`` without it).
The record goes to ``--out`` (default ``.bench/lent_versions/<pins>.json``), the suite's log beside it.
Results: docs/benchmarks.md#lent-versions-on-cpu.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import BENCH_DIR, REPO_ROOT

# What the lent machine's image lists (docs of the device kinds, pip list as a session saw it, 2026-11).
LENT: dict[str, str] = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "accelerate": "1.15.0",
    "numpy": "2.5.2",
    "huggingface_hub": "1.33.0",
    # The image has peft without a version on record; the newest release (the project's own environment's).
    "peft": "0.21.2",
}
LENT_PYTHON = "3.12"  # the image's python3 is 3.12.3 (numpy 2.5 installs on 3.12 and later only)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Reported as installed, beside the pins.
REPORTED = ("torch", "transformers", "peft", "tokenizers", "safetensors", "accelerate", "numpy", "huggingface_hub",
            "datasets", "torchao", "pytest")
MARKER = "slimgrpo-lent-versions.json"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    """``'peft>=0.17'`` -> ``'peft'``; ``'huggingface_hub[cli]==1'`` -> ``'huggingface-hub'``."""
    return _norm(re.split(r"[\s<>=!~;\[(@]", req.strip(), maxsplit=1)[0])


def project_requirements(pyproject_text: str, pinned: dict[str, str], extras: tuple[str, ...] = ("test",)) -> list[str]:
    """The project's dependencies and ``extras`` from pyproject.toml, each pinned name replaced by its pin."""
    try:
        import tomllib
    except ImportError as e:  # Python 3.10
        raise SystemExit("benchmarks.lent_versions reads pyproject.toml with tomllib: run it with Python 3.11+") from e
    project = tomllib.loads(pyproject_text)["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    pins = {_norm(k): f"{k}=={v}" for k, v in pinned.items()}
    out = [pins[n] for n in pins]
    for req in reqs:
        if requirement_name(req) not in pins and req not in out:
            out.append(req)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lent_versions", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, version in LENT.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=version,
                       help=f"version to install (default: {version})")
    p.add_argument("--pin", action="append", default=[], metavar="NAME==VERSION",
                   help="another exact version, e.g. --pin torchao==0.10.0 (the test extra's torchao for an old torch)")
    p.add_argument("--python", default=None,
                   help=f"interpreter the environment is made from (default: python{LENT_PYTHON} where found, the "
                        "lent machine's; else this one)")
    p.add_argument("--venv", type=Path, default=None,
                   help="the environment's folder, outside the repository (default: under the user's cache)")
    p.add_argument("--out", type=Path, default=None, help="the JSON record (default: .bench/lent_versions/<pins>.json)")
    p.add_argument("--torch-index", default=CPU_INDEX, help="where torch's CPU build is tried first")
    p.add_argument("--reuse", action="store_true", help="keep an environment already built with the same pins")
    p.add_argument("--install-only", action="store_true", help="build the environment, print its versions, stop")
    p.add_argument("--timeout", type=float, default=5400, help="seconds the suite may run (default 5400)")
    p.add_argument("pytest_args", nargs="*", help="after --: paths and options for pytest (default: the whole "
                                                  "fast suite); -m 'not slow' is pyproject's and always applies")
    args = p.parse_args(argv)
    if args.python is None:
        found = shutil.which(f"python{LENT_PYTHON}")
        args.python = found if found and _runs(found) else sys.executable
    if args.venv is not None and _inside(args.venv, REPO_ROOT):
        p.error(f"--venv {args.venv} is inside the repository: pick a folder outside it")
    return args


def _runs(python: str) -> bool:
    """A pyenv shim is on PATH even where its version is not selected: it fails when run."""
    try:
        return subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def pins_of(args: argparse.Namespace) -> dict[str, str]:
    pins = {name: getattr(args, name) for name in LENT}
    for pin in args.pin:
        name, sep, version = pin.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise SystemExit(f"--pin {pin!r}: expected NAME==VERSION")
        pins[name.strip()] = version.strip()
    return pins


def tag_of(pins: dict[str, str], python: str) -> str:
    """A folder name for these pins: the three that set the floors, spelled out, and a hash of everything."""
    digest = hashlib.sha1(json.dumps([pins, python], sort_keys=True).encode()).hexdigest()[:8]
    return f"torch-{pins['torch']}-transformers-{pins['transformers']}-peft-{pins['peft']}-{digest}"


def default_venv(tag: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "slimgrpo" / "lent-versions" / tag


def summarize_junit(xml_text: str) -> dict[str, Any]:
    """Counts and the failed tests' ids (``path::name``) with the first line of their message, from pytest's
    ``--junitxml``."""
    root = ET.fromstring(xml_text)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[dict[str, str]] = []
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        for case in suite.iter("testcase"):
            for kind in ("failure", "error"):
                node = case.find(kind)
                if node is not None:
                    message = (node.get("message") or node.text or "").strip().splitlines()
                    failures.append({"test": test_id(case.get("classname", ""), case.get("name", "")), "kind": kind,
                                     "message": message[0][:300] if message else ""})
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    counts["failures"] = failures
    return counts


def test_id(classname: str, name: str) -> str:
    """pytest's id from junit's dotted classname: ``tests.plan.test_x`` + ``test_y`` -> ``tests/plan/test_x.py::test_y``,
    ``tests.m.test_x.TestA`` -> ``tests/m/test_x.py::TestA::test_y``; a module that failed to collect has no
    classname and its dotted path as name."""
    if not classname:
        return name.replace(".", "/") + ".py"
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):  # the longest prefix that is a module of the checkout
        if (REPO_ROOT / Path(*parts[:cut])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
    return "/".join(parts) + ".py::" + name


def summary_line(suite: dict[str, Any]) -> str:
    return (f"{suite['passed']} passed, {suite['failed']} failed, {suite['errors']} errors, {suite['skipped']} "
            f"skipped in {suite['seconds']:.0f} s")


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    print("$", shlex.join(cmd), flush=True)
    return subprocess.run(cmd, timeout=timeout, **kw)


def _pip(python: Path) -> list[str]:
    return [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]


def install_torch(python: Path, version: str, index: str) -> dict[str, str]:
    """torch==version from the CPU index, else from the default index; what was installed and from where."""
    tried = _run([*_pip(python), "--retries", "0", "--timeout", "20", "--index-url", index, f"torch=={version}"],
                 timeout=1800, capture_output=True, text=True)
    if tried.returncode == 0:
        return {"source": index, "note": f"the CPU build from {index}"}
    print(f"  torch {version}: not found at {index} ({_last_line(tried.stderr)}); the default index instead", flush=True)
    _run([*_pip(python), f"torch=={version}"], timeout=3600, check=True)
    return {"source": "default index", "note": f"{index} could not be used ({_last_line(tried.stderr)}); "
                                               f"torch {version} from the default index (on Linux PyPI's CUDA build, "
                                               "run here on CPU)"}


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else "no output"


def installed_versions(python: Path, names: tuple[str, ...] = REPORTED) -> dict[str, Any]:
    code = ("import importlib.metadata as m, json, platform, sys\n"
            f"names = {list(dict.fromkeys(names))!r}\n"
            "out = {'python': platform.python_version()}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = None\n"
            "import torch\n"
            "out['torch_build'] = torch.__version__\n"
            "out['torch_cuda'] = torch.version.cuda\n"
            "print(json.dumps(out))\n")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=600, cwd="/")
    if done.returncode != 0:
        raise SystemExit(f"the environment's packages do not import:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(args: argparse.Namespace, venv: Path, pins: dict[str, str]) -> dict[str, Any]:
    """Builds (or reuses) the environment; returns the marker: pins, torch's source, install seconds."""
    python = venv / "bin" / "python"
    marker = venv / MARKER
    wanted = {"pins": pins, "python_from": args.python}
    if args.reuse and marker.is_file() and python.is_file():
        known = json.loads(marker.read_text())
        if {k: known.get(k) for k in wanted} == wanted:
            print(f"reusing {venv}", flush=True)
            if known.get("checkout") != str(REPO_ROOT):
                install_checkout(python)
                known["checkout"] = str(REPO_ROOT)
                marker.write_text(json.dumps(known, indent=1))
            return known
    t0 = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run([args.python, "-m", "venv", "--clear", str(venv)], timeout=600, check=True)
    torch = install_torch(python, pins["torch"], args.torch_index)
    reqs = project_requirements((REPO_ROOT / "pyproject.toml").read_text(), pins)
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in pins.items()))
    done = _run([*_pip(python), "-c", str(constraints), *reqs], timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"pip could not install {' '.join(reqs)} with {python} (a pin with no wheel for this "
                         "Python? pass another --python or version)")
    install_checkout(python)
    known = {**wanted, "torch_source": torch, "install_seconds": round(time.monotonic() - t0, 1),
             "checkout": str(REPO_ROOT)}
    marker.write_text(json.dumps(known, indent=1))
    return known


def install_checkout(python: Path) -> None:
    """This checkout, editable and without dependencies, as CI installs it (``pip install -e .``): the tests that
    run ``slimgrpo`` itself (the README's commands) find its console script; PYTHONPATH still puts src first."""
    _run([*_pip(python), "-q", "--no-deps", "-e", str(REPO_ROOT)], timeout=900, check=True)


def run_suite(python: Path, pytest_args: list[str], log: Path, junit: Path, timeout: float) -> dict[str, Any]:
    """The fast suite in the environment, against this checkout's src; its output to the terminal and ``log``."""
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--continue-on-collection-errors",
           f"--junitxml={junit}",
           *(pytest_args or [])]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(REPO_ROOT / "src")
    env["PYTHONUNBUFFERED"] = "1"  # the progress dots as they come
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    print("$", shlex.join(cmd), flush=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                out.write(line)
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    seconds = time.monotonic() - t0
    if not junit.is_file():
        return {"exit_code": rc, "seconds": round(seconds, 1), "tests": 0, "passed": 0, "failed": 0, "errors": 1,
                "skipped": 0, "failures": [{"test": "(pytest)", "kind": "error", "message": f"no junit report, "
                                            f"exit {rc}; see {log}"}]}
    return {"exit_code": rc, "seconds": round(seconds, 1), **summarize_junit(junit.read_text())}


def record(args: argparse.Namespace, pins: dict[str, str], built: dict[str, Any], versions: dict[str, Any],
           suite: dict[str, Any] | None, argv: list[str]) -> dict[str, Any]:
    return {
        "command": shlex.join(["python", "-m", "benchmarks.lent_versions", *argv]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "cpu_cores": os.cpu_count(),
                    "load_avg_1m": round(os.getloadavg()[0], 2)},
        "pins": pins,
        "python_from": args.python,
        "installed": versions,
        "torch_source": built.get("torch_source"),
        "install_seconds": built.get("install_seconds"),
        "differs_from_pins": {k: versions.get(k) for k, v in pins.items() if versions.get(k) != v},
        "suite": suite,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    pins = pins_of(args)
    tag = tag_of(pins, args.python)
    venv = args.venv or default_venv(tag)
    out = args.out or BENCH_DIR / "lent_versions" / f"{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    built = build(args, venv, pins)
    python = venv / "bin" / "python"
    versions = installed_versions(python, (*REPORTED, *pins))
    print(f"\nenvironment: {venv}")
    print(f"torch: {(built.get('torch_source') or {}).get('note', '?')}")
    for name in dict.fromkeys(("python", "torch_build", *REPORTED[1:], *pins)):
        pin = pins.get(name, "")
        flag = "" if not pin or versions.get(name) == pin else f"   (asked {pin})"
        print(f"  {name:16s} {versions.get(name)}{flag}")
    suite = None
    if not args.install_only:
        suite = run_suite(python, args.pytest_args, out.with_suffix(".log"), out.with_suffix(".junit.xml"),
                          args.timeout)
    rec = record(args, pins, built, versions, suite, argv)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    if suite is not None:
        print(f"\nlent versions (torch {versions['torch_build']}, transformers {versions['transformers']}, peft "
              f"{versions['peft']}, Python {versions['python']}): {summary_line(suite)}")
        for f in suite["failures"]:
            print(f"  {f['kind'].upper()} {f['test']}: {f['message']}")
    print(f"record: {out}")
    return 0 if suite is None or (suite["exit_code"] == 0 and not suite["failures"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
