"""benchmarks/lent_versions.py's arguments, requirement list, pytest summary and record; nothing is installed here
(the environment, pip and the suite are stubbed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import lent_versions as lv

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="1"
skipped="2" tests="11" time="3.0"><testcase classname="tests.memory.test_cpu_gqa" name="test_native" time="1">
<failure message="AssertionError: [(6, False)]&#10;assert False">trace</failure></testcase>
<testcase classname="tests.plan.test_x" name="test_y[a]" time="0"><error message="fixture broke">e</error></testcase>
<testcase classname="tests.plan.test_x" name="test_z" time="0"><skipped message="no gpu"/></testcase>
<testcase classname="" name="tests.agent.test_agent_templates" time="0"><error message="collection failure"/></testcase>
</testsuite></testsuites>"""


def test_defaults_are_the_lent_machines_versions_and_each_is_a_flag(tmp_path):
    args = lv.parse_args(["--venv", str(tmp_path / "env")])
    assert lv.pins_of(args) == lv.LENT
    assert lv.LENT["transformers"] == "5.17.0" and lv.LENT["torch"] == "2.11.0"
    floors = lv.parse_args(["--torch", "2.6.0", "--peft", "0.17.0", "--huggingface-hub", "1.5.0", "--pin",
                            "torchao==0.10.0", "--", "tests/memory", "-x"])
    pins = lv.pins_of(floors)
    assert pins["torchao"] == "0.10.0"
    with pytest.raises(SystemExit):
        lv.pins_of(lv.parse_args(["--pin", "torchao>=0.10"]))
    assert (pins["torch"], pins["peft"], pins["huggingface_hub"], pins["transformers"]) == ("2.6.0", "0.17.0",
                                                                                           "1.5.0", "5.17.0")
    assert floors.pytest_args == ["tests/memory", "-x"]
    assert lv.tag_of(pins, "py") != lv.tag_of(lv.LENT, "py") and "torch-2.6.0" in lv.tag_of(pins, "py")
    assert lv.default_venv("t").parts[-3:] == ("slimgrpo", "lent-versions", "t")


def test_the_environment_is_refused_inside_the_repository():
    with pytest.raises(SystemExit):
        lv.parse_args(["--venv", str(ROOT / ".venv-lent")])


def test_requirements_are_the_projects_with_the_pins_in_place_of_its_ranges():
    text = """[project]
dependencies = ["torch>=2.4", "transformers>=4.56", "peft>=0.17", "numpy>=1.26", "rich>=13"]
[project.optional-dependencies]
test = ["pytest>=8", "torchao>=0.10"]
gpu = ["bitsandbytes>=0.45"]
"""
    reqs = lv.project_requirements(text, {"torch": "2.6.0", "huggingface_hub": "1.33.0", "numpy": "2.5.2",
                                          "transformers": "5.17.0", "peft": "0.17.0"})
    assert reqs[:5] == ["torch==2.6.0", "huggingface_hub==1.33.0", "numpy==2.5.2", "transformers==5.17.0",
                        "peft==0.17.0"]
    assert reqs[5:] == ["rich>=13", "pytest>=8", "torchao>=0.10"]  # no range of a pinned name, no other extra
    assert lv.requirement_name("Huggingface_Hub[cli]>=1; python_version>'3'") == "huggingface-hub"
    # The real pyproject: every pin once, the test extra in.
    real = lv.project_requirements((ROOT / "pyproject.toml").read_text(), lv.LENT)
    names = [lv.requirement_name(r) for r in real]
    assert len(names) == len(set(names)) and "pytest" in names and "datasets" in names


def test_junit_summary_counts_and_names_the_failures():
    s = lv.summarize_junit(JUNIT)
    assert (s["tests"], s["passed"], s["failed"], s["errors"], s["skipped"]) == (11, 6, 1, 2, 2)
    assert s["failures"] == [
        {"test": "tests/memory/test_cpu_gqa.py::test_native", "kind": "failure", "message": "AssertionError: [(6, False)]"},
        {"test": "tests/plan/test_x.py::test_y[a]", "kind": "error", "message": "fixture broke"},
        {"test": "tests/agent/test_agent_templates.py", "kind": "error", "message": "collection failure"}]
    assert lv.summary_line({**s, "seconds": 12.4}) == "6 passed, 1 failed, 2 errors, 2 skipped in 12 s"
    # A test class: the module is the longest dotted prefix that is a file of the checkout.
    assert (lv.test_id("tests.benchmarks.test_lent_versions.TestA", "test_b")
            == "tests/benchmarks/test_lent_versions.py::TestA::test_b")


def test_main_writes_the_record_and_fails_on_a_failed_test(tmp_path, monkeypatch, capsys):
    installed = {**lv.LENT, "python": "3.12.1", "torch_build": "2.11.0", "numpy": "2.4.6", "datasets": "4",
                 "torchao": "0.1", "pytest": "9", "torch_cuda": "13.0"}
    monkeypatch.setattr(lv, "build", lambda args, venv, pins: {"torch_source": {"source": "default index",
                                                                                "note": "PyPI"}, "install_seconds": 5})
    monkeypatch.setattr(lv, "installed_versions", lambda python, names: installed)
    seen = {}

    def suite(python, pytest_args, log, junit, timeout):
        seen.update(python=python, args=pytest_args, log=log)
        return {"exit_code": 1, "seconds": 3.0, **lv.summarize_junit(JUNIT)}

    monkeypatch.setattr(lv, "run_suite", suite)
    out = tmp_path / "rec.json"
    argv = ["--venv", str(tmp_path / "env"), "--out", str(out), "--", "tests/memory"]
    assert lv.main(argv) == 1
    rec = json.loads(out.read_text())
    assert rec["command"] == "python -m benchmarks.lent_versions " + " ".join(argv)
    assert rec["pins"] == lv.LENT and rec["differs_from_pins"] == {"numpy": "2.4.6"}
    assert rec["suite"]["failed"] == 1 and rec["torch_source"]["source"] == "default index"
    assert seen == {"python": tmp_path / "env" / "bin" / "python", "args": ["tests/memory"], "log": out.with_suffix(".log")}
    printed = capsys.readouterr().out
    assert "6 passed, 1 failed, 2 errors, 2 skipped" in printed and "(asked 2.5.2)" in printed

    monkeypatch.setattr(lv, "run_suite", lambda *a: {"exit_code": 0, "seconds": 1.0, "tests": 1, "passed": 1,
                                                     "failed": 0, "errors": 0, "skipped": 0, "failures": []})
    assert lv.main(argv) == 0
    assert lv.main([*argv[:4], "--install-only"]) == 0 and json.loads(out.read_text())["suite"] is None
