"""Where the benchmarks read and write: the repository, ``.bench/`` (every model folder, prompt file and run log
they make; git ignores it) and the shared data folder beside the checkout (GSM8K, the model shapes)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / ".bench"
# The shared data folder next to the checkout; SLIMGRPO_SHARED_DIR (or SLIMGRPO_SHARED) points elsewhere.
SHARED_DIR = Path(os.environ.get("SLIMGRPO_SHARED_DIR") or os.environ.get("SLIMGRPO_SHARED") or REPO_ROOT.parent / "shared")
GSM8K_DIR = SHARED_DIR / "data" / "gsm8k"
MODEL_SHAPES = SHARED_DIR / "data" / "model_shapes.json"
