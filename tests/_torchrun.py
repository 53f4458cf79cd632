"""What the torchrun tests share (tests/distributed/, tests/agent/): launching ``python -m torch.distributed.run``
on this checkout's src, finishing or killing the job, the configs and reward functions of the same-step and
killed-run tests, the prompts fixture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from conftest import write_jsonl

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"

# The reward of the killed-run tests (``kill_and_resume``; ``_agent_dist_helpers.ENV`` has it too): it holds
# the run still once the file named by STALL_WHEN_EXISTS exists, so that the kill lands mid-step.
STALL_REWARD = """
def stalls_after_gate(prompts, completions, completion_ids=None, **kwargs):
    gate = os.environ.get("STALL_WHEN_EXISTS")
    if gate and os.path.exists(gate):  # hold the run still until the test kills it
        time.sleep(600)
    return [float(len(ids) % 3) for ids in completion_ids]
"""

REWARDS = """
import os, time

def vowel_share(prompts, completions, completion_ids=None, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]

def length_mod(prompts, completions, completion_ids=None, log_metric=None, **kwargs):
    log_metric("length_mod/mean_tokens", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    return [float(len(ids) % 3) for ids in completion_ids]

def fails_on_rank_1(prompts, completions, completion_ids=None, **kwargs):
    if os.environ.get("RANK") == "1":
        raise ValueError("reward exploded on rank 1 (test)")
    return [0.0 for _ in completions]
""" + STALL_REWARD


def torchrun(args: list[str], tmp_path: Path, timeout: float, nproc: int = 2, env: dict | None = None,
             **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--monitor-interval=0.2", *args]
    # This checkout's src first: an installed slimgrpo (e.g. another checkout, editable) must not answer.
    path = os.pathsep.join([str(HERE), str(HERE.parent / "src")])
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen(cmd, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **popen)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its ranks at once, like a power cut. torchrun starts every rank in a session
    of its own, so killing torchrun's process group alone would leave the ranks running."""
    ranks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"PPid:\t{proc.pid}\n" in status.read_text():
                ranks.append(int(status.parent.name))
        except OSError:
            continue
    for pid in [proc.pid, *ranks]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish within {timeout}s:\n{out[-4000:]}") from None
    return proc.returncode, out


def write_config(path: Path, model_dir: Path, prompts: Path, out: Path, rewards: list[str], **sections) -> Path:
    (path.parent / "my_rewards.py").write_text(REWARDS)
    data = {
        "model": {"path": str(model_dir)},
        "data": {"path": str(prompts), "max_prompt_length": 32},
        "rollout": {"num_generations": 4, "max_completion_length": 8},
        "rewards": {"functions": rewards},
        "loss": {},
        "memory": {"micro_batch_size": 3},
        "optim": {"learning_rate": 1e-3, "max_grad_norm": 0.5},
        "run": {"max_steps": 2, "batch_size": 16, "output_dir": str(out), "seed": 3, "num_threads": 1},
        "log": {"progress": False, "log_completions_steps": 0},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(data))
    return path


def same_step_cases(tmp_path: Path, model_dir: Path, prompts: Path, sections_of: dict[str, dict],
                    ) -> tuple[list[dict], list[dict]]:
    """Worker cases (2 steps each) for the same-step tests: for each name -> config sections, one for the
    2 ranks and one for the single process that is their reference (same config, its own run folder)."""
    two, one = [], []
    rewards = ["my_rewards.py:vowel_share", "my_rewards.py:length_mod"]
    for name, sections in sections_of.items():
        for n, group in ((2, two), (1, one)):
            config = write_config(tmp_path / f"{name}-{n}.yaml", model_dir, prompts, tmp_path / f"run-{name}-{n}",
                                  rewards, **sections)
            group.append({"name": f"{name}-{n}", "config": str(config), "steps": 2})
    return two, one


def run_two_ranks_and_one(worker: Path, job: dict, single: list[dict], run_case: Callable, tmp_path: Path,
                          timeout: float) -> None:
    """``job`` on 2 ranks of ``worker`` under torchrun while ``run_case`` runs the ``single`` cases in this
    process (the reference: one process, every prompt); the ranks must finish cleanly."""
    from slimgrpo.distributed.context import DistContext

    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    proc = torchrun([str(worker), str(path)], tmp_path, timeout=timeout)
    for case in single:  # the reference runs while the 2 ranks run
        run_case(case, Path(job["out"]), DistContext())
    code, log = finish(proc, timeout=timeout)
    assert code == 0, log[-6000:]


@pytest.fixture
def prompts(tmp_path) -> Path:
    rows = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 5)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)


def _train_command(config: Path, *overrides: str) -> list[str]:
    return ["-m", "slimgrpo", "train", str(config), *overrides]


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((run / "final").glob("*.safetensors"))
    assert files, f"no final model in {run}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def kill_and_resume(tmp_path: Path, straight: Path, broken: Path, timeout: float, wait: float) -> None:
    """Run ``straight`` uninterrupted beside ``broken``; SIGKILL torchrun and the ranks of ``broken`` once its
    checkpoint 2 is complete (a reward stalls step 3 from then on, so the kill lands mid-run every time), run
    the same command again, which must resume; both end with exit 0."""
    reference = torchrun(_train_command(straight), tmp_path, timeout=timeout)
    marker = tmp_path / "broken" / "checkpoints" / "checkpoint-2" / "COMPLETE"
    victim = torchrun(_train_command(broken), tmp_path, timeout=timeout, env={"STALL_WHEN_EXISTS": str(marker)})
    deadline = time.monotonic() + wait
    while not marker.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_job(victim)  # torchrun and both ranks, no cleanup
    _, victim_log = finish(victim, timeout=30)
    assert marker.exists(), victim_log[-4000:]
    assert not (tmp_path / "broken" / "final").exists(), "the run finished before the kill"

    code, log = finish(torchrun(_train_command(broken), tmp_path, timeout=timeout), timeout=timeout)
    assert code == 0, log[-6000:]
    assert "resumed from" in log
    code, ref_log = finish(reference, timeout=timeout)
    assert code == 0, ref_log[-6000:]
