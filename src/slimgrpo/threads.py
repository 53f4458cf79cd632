"""CPU threads and the OpenMP wait policy, chosen before torch loads and recorded in the run folder.

torch's CPU kernels run on an OpenMP team (libgomp in the pip wheels).  At the end of every parallel
region the threads that are done wait for the rest, and by default libgomp *spins* there (about 300,000
iterations) before sleeping.  On a machine shared with another CPU-bound process one of the team's
threads is regularly descheduled, and the others then burn their time slices spinning at each of the
thousands of small regions of a decode step: generation slowed 19x with one competitor on two cores
(python -m benchmarks.rollout.busy_machine measures it).  A passive policy (``OMP_WAIT_POLICY=PASSIVE``: wait by
sleeping) removes that cliff.

libgomp reads the policy once, when torch's libraries load, so it is set in the environment by
``early_default`` (called by ``import slimgrpo`` when torch is not loaded yet) and, when a config asks
for another policy, by re-running the ``slimgrpo train`` command with it (``reexec_for``).  Variables
the user set (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) always win.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

POLICIES = ("auto", "passive", "active")
_POLICY_ENV = "OMP_WAIT_POLICY"
_USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_REEXEC_MARK = "SLIMGRPO_THREADS_REEXEC"
_SET_BY_US = "SLIMGRPO_SET_OMP_WAIT_POLICY"


def _env_value(policy: str) -> str:
    return "ACTIVE" if policy == "active" else "PASSIVE"  # auto = passive


def early_default(policy: str | None = None) -> None:
    """Sets ``OMP_WAIT_POLICY`` for ``policy`` (default: ``$SLIMGRPO_THREAD_WAIT_POLICY`` or auto) if torch
    is not loaded yet and the user set no wait variable themselves."""
    if "torch" in sys.modules or any(v in os.environ for v in _USER_VARS):
        return
    policy = policy or os.environ.get("SLIMGRPO_THREAD_WAIT_POLICY", "auto")
    os.environ[_POLICY_ENV] = _env_value(policy if policy in POLICIES else "auto")
    os.environ[_SET_BY_US] = "1"


def _effective() -> str:
    value = os.environ.get(_POLICY_ENV)
    if value:
        return value.lower()
    if "GOMP_SPINCOUNT" in os.environ:
        return f"spincount={os.environ['GOMP_SPINCOUNT']}"
    return "default (spin, then sleep)"


def wanted_env(policy: str) -> str | None:
    """The ``OMP_WAIT_POLICY`` value ``policy`` needs, or None when the current one will do (auto keeps
    whatever the user set)."""
    if policy == "auto":
        return None if any(v in os.environ for v in _USER_VARS) else _env_value("auto")
    return _env_value(policy)


def reexec_for(policy: str) -> None:
    """Re-runs this process (``slimgrpo train ...``) with the wait policy ``policy`` in its environment
    when the loaded OpenMP runtime has another one; a no-op when it already matches (or after one re-run)."""
    want = wanted_env(policy)
    if want is None or os.environ.get(_POLICY_ENV, "").upper() == want or os.environ.get(_REEXEC_MARK):
        return
    env = dict(os.environ, **{_POLICY_ENV: want, _REEXEC_MARK: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "slimgrpo", *sys.argv[1:]], env)


def apply(num_threads: int | None, policy: str) -> dict:
    """Sets torch's intra-op threads (``num_threads``; None keeps torch's default) and returns what is in
    effect, for ``record``.  A policy that differs from the loaded runtime's is reported, not applied
    (it cannot change after torch loaded)."""
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    want = wanted_env(policy)
    effective = _effective()
    info = {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "wait_policy_requested": policy,
        "wait_policy_effective": effective,
        "wait_policy_applied": want is None or effective.upper() == want,
        "set_by_slimgrpo": bool(os.environ.get(_SET_BY_US)),
        "environment": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS",
                                                  "MKL_NUM_THREADS") if k in os.environ},
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if not info["wait_policy_applied"]:
        import logging

        logging.getLogger("slimgrpo").warning(
            "run.thread_wait_policy=%s needs OMP_WAIT_POLICY=%s before torch loads, but the runtime has %s; "
            "run through `slimgrpo train` or export OMP_WAIT_POLICY=%s", policy, want, effective, want)
    return info


def record(output_dir: Path, info: dict) -> None:
    """Writes ``threads.json`` (what ``apply`` returned) into the run folder."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "threads.json").write_text(json.dumps(info, indent=2) + "\n")
