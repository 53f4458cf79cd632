"""Thread count and OpenMP wait policy: set before torch loads, overridable, recorded in the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from run_helpers import cli, write_run

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
PROBE = "import os, slimgrpo, torch; print(os.environ.get('OMP_WAIT_POLICY'))"


def _probe(extra: dict[str, str], code: str = PROBE) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(PYTHONPATH=SRC, **extra)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_import_sets_passive_before_torch_and_respects_the_user():
    assert _probe({}) == "PASSIVE"
    assert _probe({"OMP_WAIT_POLICY": "active"}) == "active"
    assert _probe({"GOMP_SPINCOUNT": "1000"}) == "None"  # the user's own spin setting is left alone
    assert _probe({"SLIMGRPO_THREAD_WAIT_POLICY": "active"}) == "ACTIVE"
    # torch loaded first: too late to change the runtime, nothing is set
    assert _probe({}, "import os, torch, slimgrpo; print(os.environ.get('OMP_WAIT_POLICY'))") == "None"


def test_bad_policy_is_a_config_error(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir)
    out = cli("train", str(cfg), "run.thread_wait_policy=sometimes")
    assert out.returncode == 2 and "thread_wait_policy" in out.stderr


@pytest.mark.slow
def test_run_records_threads_and_reexecs_for_active(tmp_path, tiny_model_dir):
    cfg = write_run(tmp_path, tiny_model_dir, run={"max_steps": 1, "save_checkpoints": False})
    env = {"OMP_WAIT_POLICY": ""}  # unset below
    out = cli("train", str(cfg), "run.thread_wait_policy=active", "run.save_model=false",
              env={k: v for k, v in env.items() if v})
    assert out.returncode == 0, out.stderr
    info = json.loads((tmp_path / "run" / "threads.json").read_text())
    assert info["num_threads"] == 1
    assert info["wait_policy_requested"] == "active"
    assert info["wait_policy_effective"] == "active" and info["wait_policy_applied"]
