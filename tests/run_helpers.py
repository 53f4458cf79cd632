"""Helpers for tests that run whole trainings: a config file beside a prompts file and a reward file,
the CLI in a subprocess, and comparisons of run folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

# A reward that varies between completions of a random model (so groups carry signal), and that can
# signal its own process on its N-th call: TEST_SIGNAL_AT_CALL="KILL:3" or "TERM:2". That puts a kill or a
# preemption at an exact point in the middle of a step, deterministically ("TERM:1;TERM:1" sends two).
REWARD_FILE = '''
import os
import signal
import time

_state = {"spec": None, "calls": 0}  # calls counted since TEST_SIGNAL_AT_CALL last changed


def vowels(prompts, completions, completion_ids=None, **kwargs):
    spec = os.environ.get("TEST_SIGNAL_AT_CALL", "")
    if spec != _state["spec"]:
        _state.update(spec=spec, calls=0)
    _state["calls"] += 1
    for action in filter(None, spec.split(";")):
        name, _, at = action.partition(":")
        if _state["calls"] == int(at):
            os.kill(os.getpid(), getattr(signal, "SIG" + name))
            time.sleep(0.2)  # rewards run in a worker thread: let the main thread handle this signal first
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]
'''

PROMPTS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in
           [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]]  # 5 prompts: an epoch ends in the middle of a batch


def write_run(folder: Path, model_dir: Path, *, prompts: list[dict] | None = None,
              reward_code: str = REWARD_FILE, **sections) -> Path:
    """Write prompts.jsonl, my_rewards.py and cfg.yaml into ``folder``; ``sections`` update the config,
    e.g. ``run={"max_steps": 4}``. Returns the config path. The run folder is ``folder/run``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (prompts or PROMPTS)))
    (folder / "my_rewards.py").write_text(reward_code)
    cfg = {
        "model": {"path": str(model_dir)},
        "data": {"path": "prompts.jsonl", "max_prompt_length": 32},
        "rollout": {"num_generations": 4, "max_completion_length": 8},
        "rewards": {"functions": ["my_rewards.py:vowels", "length"]},
        "optim": {"learning_rate": 1e-2, "lr_scheduler_type": "cosine", "warmup_steps": 1},
        "loss": {"beta": 0.04},
        "run": {"max_steps": 3, "batch_size": 8, "output_dir": str(folder / "run"), "seed": 5, "num_threads": 1},
        "log": {"progress": False, "log_completions_steps": 1},
    }
    return write_config(folder / "cfg.yaml", cfg, sections)


def write_config(path: Path, cfg: dict, sections: dict) -> Path:
    """``cfg`` with each of ``sections`` merged into its section, written to ``path`` as YAML."""
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(*argv) -> int:
    """``slimgrpo train ARGV`` in this process; torch's thread count is restored afterwards."""
    import torch

    from slimgrpo.commands.cli import main

    threads = torch.get_num_threads()
    try:
        return main(["train", *map(str, argv)])
    finally:
        torch.set_num_threads(threads)


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m slimgrpo ARGS`` in a fresh process (CUDA hidden, one thread)."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "slimgrpo", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "slimgrpo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, keyed by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def metrics(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


# Metrics that measure the machine rather than the computation.
TIMING_KEYS = ("time/", "gen/tokens_per_s", "memory/")


def numeric_metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in metrics(run)]
