"""What a child process tells the benchmark that started it: one JSON record per stdout line, after the marker
``@@bench `` (``measure.run_measured`` parses them as they arrive), and the peaks a child reads from inside
(CUDA's, which no outside measurement sees). Light on purpose: a child imports this before it starts timing."""

from __future__ import annotations

import json
from pathlib import Path

# Lines a child prints on stdout that start with this marker carry one JSON record for the harness.
RECORD_MARKER = "@@bench "


def emit(record: dict) -> None:
    """One record of a benchmark child, parsed by run_measured in the parent."""
    print(RECORD_MARKER + json.dumps(record), flush=True)


def emit_end(train_s: float) -> None:
    """A training child's last record: its training time and the CUDA peaks (None without CUDA)."""
    emit({"event": "end", "train_s": train_s, "peak_cuda_mib": peak_cuda_mib(),
          "peak_cuda_reserved_mib": peak_cuda_reserved_mib()})


def peak_cuda_mib() -> float | None:
    """Peak memory held by tensors (what the tables compare); None without CUDA."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def peak_cuda_reserved_mib() -> float | None:
    """Peak memory held by the caching allocator (closer to what nvidia-smi shows); None without CUDA."""
    import torch

    return torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else None


def read_jsonl(path: Path) -> list[dict]:
    """The JSON rows of a ``.jsonl`` file (a run's metrics.jsonl, a prompt file), blank lines skipped."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
