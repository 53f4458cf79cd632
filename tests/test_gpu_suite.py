"""benchmarks/gpu_suite.py --device cpu --smoke: the plumbing of the GPU suite, on tiny shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _gpu_report import SECTIONS as REPORT_SECTIONS  # noqa: E402
from gpu_suite import SECTIONS, planner_runs, settings  # noqa: E402


def _run(out: Path, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), TQDM_DISABLE="1")
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_suite.py"), "--device", "cpu", "--smoke",
                           "--out", str(out), "--work", str(out / "work"), *extra],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "gpu_suite.json").read_text())


def test_smoke_writes_json_and_markdown_with_every_section(tmp_path):
    report = _run(tmp_path)
    md = (tmp_path / "gpu_suite.md").read_text()
    assert list(report["sections"]) == SECTIONS
    assert [name for name, _, _ in REPORT_SECTIONS] == SECTIONS
    for name, title, _ in REPORT_SECTIONS:
        assert f"## {title}" in md, title
        assert "status" in report["sections"][name] and "seconds" in report["sections"][name]
    s = report["sections"]
    assert s["env"]["status"] == "ok" and s["env"]["rows"][0]["torch"]
    # On CPU every cuda test skips or is deselected; none fails.
    assert s["cuda_tests"]["status"] == "ok", s["cuda_tests"]
    assert s["cuda_tests"]["rows"][0]["failed"] == 0 and s["cuda_tests"]["rows"][0]["skipped"] > 0
    for name in ("loss", "update_only_long", "rollout", "planner"):
        assert s[name]["status"] == "ok", (name, s[name])
        assert s[name]["rows"] and all(r.get("status", "ok") == "ok" for r in s[name]["rows"]), s[name]["rows"]
    assert {r["path"] for r in s["loss"]["rows"]} == {"chunked", "naive"}
    assert all(r["max_abs_logp_diff"] < 1e-4 for r in s["loss"]["rows"])  # fp32 on CPU: the two paths agree
    assert len(s["planner"]["rows"]) == len(planner_runs(settings(True)))
    assert all(r["plan_mib"] > 0 and r["peak_alloc_mib"] is None for r in s["planner"]["rows"])  # no CUDA peak
    assert s["quantized"]["status"] == "skipped: needs CUDA"
    assert s["vs_trl"]["status"].startswith(("skipped", "not installed"))
    assert "not evaluated" in md  # a smoke run claims no goal


def test_sections_selection_and_zero_budget(tmp_path):
    report = _run(tmp_path, "--only", "loss", "--time-limit", "0")
    s = report["sections"]
    assert s["cuda_tests"]["status"] == "skipped: not selected"
    assert s["loss"]["status"].startswith("skipped: budget")  # no time left: recorded, not run


def test_planner_runs_put_trl_pairs_first():
    full = settings(False)
    runs = planner_runs(full)
    assert len(runs) == len(set(runs)) == 12  # 3 shapes x full/LoRA x checkpointing off/on
    assert runs[:4] == [("qwen2.5-0.5b", False, False), ("qwen2.5-0.5b", True, False),
                        ("llama-3.2-1b", False, False), ("llama-3.2-1b", True, False)]
    assert full["G"] == 4 and full["P"] == 256 and full["L"] == 786  # the Oxen settings
    assert full["long"] == {"shape": "llama-3.1-8b", "rows": 8, "P": 256, "L": 20_000, "micro": 1}


@pytest.mark.slow
def test_smoke_with_trl_child(tmp_path):
    pytest.importorskip("trl")
    report = _run(tmp_path, "--trl", "on", "--only", "planner", "vs_trl")
    rows = report["sections"]["vs_trl"]["rows"]
    assert rows and all(r["status"] == "ok" and r["trl_steps"] >= 1 for r in rows), rows
