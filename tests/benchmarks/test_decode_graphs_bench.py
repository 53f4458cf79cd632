"""benchmarks/decode_graphs.py at its tiny size on CPU: it runs, writes its JSON, and reports the static-cache
stepper's greedy tokens equal to the eager path's (the GPU suite runs it with --device cuda)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_graphs.py"


def test_decode_graphs_tiny_cpu(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("decode_graphs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "decode_graphs", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    out = tmp_path / "decode.json"
    assert module.main(["--device", "cpu", "--tiny", "--reps", "1", "--budget-s", "600", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert data["device"] == "cpu" and set(rows) == {"base", "lora", "qlora"}
    for name in ("base", "lora"):
        row = rows[name]
        assert row["status"] == "ok" and row["greedy_equal"] is True, row
        assert row["ended_early"] > 0 and row["eager_tok_s"] > 0 and row["graphs_tok_s"] > 0  # EOS was on
    assert rows["qlora"]["status"].startswith("skipped")  # bitsandbytes needs CUDA
