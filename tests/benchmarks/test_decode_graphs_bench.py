"""benchmarks/rollout/decode_graphs.py at its tiny size on CPU: it runs, writes its JSON, and reports the static-cache
stepper's greedy tokens equal to the eager path's (the GPU suite runs it with --device cuda)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_decode_graphs_tiny_cpu(tmp_path):
    from benchmarks.rollout import decode_graphs as module

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
