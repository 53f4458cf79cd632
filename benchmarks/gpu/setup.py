"""The GPU suite's install step, guarded: nothing here raises, every outcome becomes a report row.

The lent GPU machine (docs/benchmarks.md#gpu-suite) has its own Python (3.12.3 at the last reading) with a
CUDA torch, transformers, peft and accelerate, and no package index. What it lacks (trl, datasets, dill,
multiprocess, torchao, bitsandbytes: benchmarks/gpu/wheels.py) travels as wheels in ``.whl/``
(scripts/fetch_gpu_wheels.sh); a listed wheel that is not there is reported "missing". Each wheel is checked
against this interpreter's tags first (a ``py312`` wheel on 3.13 is reported, not installed), skipped when the
same version is already there (in the image, or in the private folder from an earlier call on the same
machine), and installed, with a timeout, into that private folder, which the suite's children find first on
PYTHONPATH. The project itself is not pip-installed: the children import it
from ``src/`` and the benchmarks package from the repository root (an editable install would write into the
image's environment and needs setuptools without build isolation, for nothing the path does not give).

This module imports neither torch nor the project: the driver must reach its first report even when
those are broken.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.gpu.wheels import WHEELS
from benchmarks.harness import processes

INSTALL_TIMEOUT_S = 90.0  # one wheel (bitsandbytes' 43 MB unpacks in a few seconds)
PROBE_TIMEOUT_S = 120.0  # importing torch + transformers + trl + bitsandbytes cold
# What the suite's sections import (suite.PROBES, per section, picks from these); probed in a child, each alone,
# so one broken package names itself. "module:name" imports the module and takes the name from it (a lazy
# package such as trl imports its trainer only then).
PROBED = ("torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "datasets", "trl",
          "trl:GRPOTrainer", "torchao", "torchao.optim:_AdamW", "bitsandbytes", "bitsandbytes.optim:AdamW8bit",
          "pyarrow", "slimgrpo")

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)"
                    r"-(?P<plat>[^-]+)\.whl$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_info(path: Path) -> dict[str, Any] | None:
    """Name, version and tag triples of a wheel file name (PEP 427); None when it is not one."""
    m = _WHEEL.match(path.name)
    if not m:
        return None
    tags = {(py, abi, plat) for py in m["py"].split(".") for abi in m["abi"].split(".") for plat in m["plat"].split(".")}
    return {"name": normalize(m["name"]), "version": m["version"], "tags": tags, "tag": f"{m['py']}-{m['abi']}-{m['plat']}"}


def supported_tags() -> set[tuple[str, str, str]]:
    """This interpreter's wheel tags (``packaging``, as pip decides); a plain guess when it is absent."""
    try:
        from packaging.tags import sys_tags

        return {(t.interpreter, t.abi, t.platform) for t in sys_tags()}
    except Exception:  # packaging missing: cpXY / pyXY / py3, any platform this machine could be
        v = f"{sys.version_info.major}{sys.version_info.minor}"
        plats = {"any", "linux_x86_64"} | {f"manylinux_2_{n}_x86_64" for n in range(5, 40)} | \
                {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"}
        return {(py, abi, plat) for py in (f"cp{v}", f"py{v}", "py3", f"py{sys.version_info.major}")
                for abi in ("none", "abi3", f"cp{v}") for plat in plats}


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except Exception:
        return None


def target_version(target: Path, name: str) -> str | None:
    """The version of ``name`` in the wheels' private folder (an earlier call's install), or None."""
    try:
        for dist in metadata.distributions(path=[str(target)]):
            if normalize(dist.metadata["Name"] or "") == normalize(name):
                return dist.version
    except Exception:
        pass
    return None


def missing_rows(folder: Path, wheels: list[dict], rows: list[dict]) -> list[dict]:
    """A row for each wheel of benchmarks/gpu/wheels.py that ``folder`` does not hold and this Python lacks."""
    seen = {w["name"] for w in wheels} | {r.get("name") for r in rows}
    return [{"wheel": w.file, "name": normalize(w.name), "version": w.version,
             "status": f"missing: not in {folder} and not installed (scripts/fetch_gpu_wheels.sh); {w.why}"}
            for w in WHEELS if normalize(w.name) not in seen and installed_version(w.name) != w.version]


def choose_wheels(folder: Path, tags: set | None = None) -> tuple[list[dict], list[dict]]:
    """(wheels to consider, one per distribution, newest compatible first; rows for the rest: files that are
    not wheels, wheels for another Python or platform, second copies of a distribution)."""
    tags = supported_tags() if tags is None else tags
    chosen: dict[str, dict] = {}
    rows: list[dict] = []
    for path in sorted(folder.glob("*.whl")):
        info = wheel_info(path)
        if info is None:
            rows.append({"wheel": path.name, "status": "skipped: not a wheel file name"})
            continue
        info["path"] = path
        if not info["tags"] & tags:
            rows.append({"wheel": path.name, "name": info["name"], "version": info["version"],
                         "status": f"skipped: built for {info['tag']}, not for this Python "
                                   f"({sys.implementation.name} {sys.version.split()[0]})"})
            continue
        other = chosen.get(info["name"])
        if other is not None:  # two versions of one distribution would stop pip: keep one, say so
            rows.append({"wheel": path.name, "name": info["name"], "version": info["version"],
                         "status": f"skipped: a second wheel of {info['name']} ({other['path'].name} kept)"})
            continue
        chosen[info["name"]] = info
    return list(chosen.values()), rows


def pip_install(wheels: Path | list[Path], target: Path, timeout: float) -> tuple[bool, str]:
    """Wheels, offline, no dependencies, into ``target``; (ok, why) and never an exception."""
    paths = [wheels] if isinstance(wheels, Path) else list(wheels)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(target), *map(str, paths)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"pip did not finish in {timeout:.0f} s"
    except OSError as e:
        return False, f"pip could not start: {e}"
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        return False, f"pip exit {proc.returncode}: {lines[-1] if lines else 'no output'}"[:400]
    return True, "installed"


def install_wheels(folder: Path | None, target: Path, deadline: float, dry_run: bool = False) -> list[dict]:
    """Every wheel of ``folder`` checked and, where needed, installed into ``target`` (one pip call each).
    ``dry_run``: the same checks and installs (``target`` is a scratch folder the suite owns), so CI runs
    the very code the GPU call does. Rows: wheel, name, version, status."""
    if folder is None:
        return [{"wheel": "-", "status": "no wheels folder given (--wheels) and none at .whl/"}]
    if not folder.is_dir():
        return [{"wheel": str(folder), "status": "skipped: no such folder"}]
    try:
        wheels, rows = choose_wheels(folder)
    except Exception as e:  # an unreadable folder: reported, the suite goes on
        return [{"wheel": str(folder), "status": f"failed: {type(e).__name__}: {e}"}]
    missing = missing_rows(folder, wheels, rows)
    if not wheels and not rows:
        return [{"wheel": str(folder), "status": "no wheels in the folder"}, *missing]
    earlier = {w["name"]: target_version(target, w["name"]) for w in wheels}  # an earlier call's install
    todo = [w for w in wheels if w["version"] not in (installed_version(w["name"]), earlier[w["name"]])]
    together, together_s = False, 0.0
    if len(todo) > 1 and deadline - time.monotonic() > 1:  # one pip start for all; one by one if that fails
        t = time.monotonic()
        try:
            target.mkdir(parents=True, exist_ok=True)
            together, _ = pip_install([w["path"] for w in todo], target, min(INSTALL_TIMEOUT_S, deadline - time.monotonic()))
        except Exception:
            together = False
        together_s = time.monotonic() - t
    for info in wheels:
        row = {"wheel": info["path"].name, "name": info["name"], "version": info["version"]}
        have = installed_version(info["name"])
        row["had"] = have
        left = deadline - time.monotonic()
        if have == info["version"]:
            row["status"] = "present: same version already installed"
        elif earlier[info["name"]] == info["version"]:
            row["status"] = "present: installed in the wheels' folder by an earlier call"
        elif together and info in todo:
            row["status"] = "installed" + (f" (over {have})" if have else "") + \
                f" (one pip call with the others, {together_s:.1f} s)"
        elif left <= 1:
            row["status"] = "skipped: budget"
        else:
            t = time.monotonic()
            try:
                target.mkdir(parents=True, exist_ok=True)
                ok, why = pip_install(info["path"], target, min(INSTALL_TIMEOUT_S, left))
            except Exception as e:
                ok, why = False, f"{type(e).__name__}: {e}"
            row["status"] = ("installed" + (f" (over {have})" if have else "")) if ok else f"failed: {why}"
            row["seconds"] = round(time.monotonic() - t, 1)
        rows.append(row)
    return rows + missing


PROBE = r"""
import importlib, json, sys, time
out = {"python": sys.version.split()[0], "executable": sys.executable, "modules": {}}
for name in sys.argv[1:]:
    t = time.monotonic()
    module, _, attr = name.partition(":")
    try:
        m = importlib.import_module(module)
        if attr:
            getattr(m, attr)
        top = sys.modules.get(module.split(".")[0], m)
        out["modules"][name] = {"ok": True, "version": str(getattr(m, "__version__", getattr(top, "__version__", "?"))),
                                "file": str(getattr(m, "__file__", "")), "s": round(time.monotonic() - t, 1)}
    except BaseException as e:
        out["modules"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
try:
    import torch
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["torch_cuda"] = torch.version.cuda
    if out["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_mib=round(p.total_memory / 2**20), sms=p.multi_processor_count,
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   host_memory_stats=hasattr(torch.cuda, "host_memory_stats"))
except BaseException as e:
    out["cuda_error"] = f"{type(e).__name__}: {e}"[:300]
print("PROBE " + json.dumps(out))
"""


def probe_imports(env: dict[str, str], timeout: float, names: tuple[str, ...] = PROBED) -> dict[str, Any]:
    """Import each of ``names`` in one child with the children's environment: versions, failures, whether
    CUDA is there. Never raises: a child that dies or hangs gives {"error": ...}."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the import probe did not finish in {timeout:.0f} s"}
    except OSError as e:
        return {"error": f"the import probe could not start: {e}"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("PROBE "):
            try:
                return json.loads(line[6:])
            except ValueError:
                break
    return {"error": f"the import probe exited {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}"}


def nvidia_smi() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except Exception:
        return None


def child_env(target: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every child: the wheels' folder first, then the repository root and src/
    (harness/processes.py), then what was there; output unbuffered (a killed child's last lines reach its
    log); no progress bars."""
    env = processes.child_env(*([target] if target is not None else []), PYTHONUNBUFFERED="1", TQDM_DISABLE="1",
                              HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    env.pop("OUT", None)  # a child never writes into the folder that comes back; the driver does
    env.update(extra or {})
    return env
