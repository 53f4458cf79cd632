"""The GPU suite (benchmarks/gpu/) off the GPU: the dry run CI runs (every section's setup, the install guards, the
report), the guards themselves (a hung child is killed at its limit, a crashing task is reported, SIGTERM
still leaves a report), the time budgets, and the later sections' --smoke plumbing on tiny shapes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import runner, setup
from benchmarks.gpu import suite as gpu_suite
from benchmarks.gpu.report import SECTIONS as REPORT_SECTIONS
from benchmarks.gpu.suite import BUDGETS, FIRST, LATER, RESERVE_S, SECTIONS, tasks_of

REPO = Path(__file__).resolve().parents[2]
SUITE = [sys.executable, "-m", "benchmarks.gpu.suite"]  # run from the repository root
NEXT_PY = f"py3{sys.version_info.minor + 1}"  # a wheel for the next Python (as multiprocess ships one per version)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]), TQDM_DISABLE="1")
    env.pop("OUT", None)
    return env


def _run(out: Path, *extra: str, timeout: float = 900) -> dict:
    proc = subprocess.run([*SUITE, "--out", str(out), "--work", str(out / "work"), *extra],
                          capture_output=True, text=True, env=_env(), cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "gpu_suite.json").read_text())


def _wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any") -> Path:
    """A minimal pure-Python wheel (one module that sets VALUE = 42), as pip installs it."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-{tag}.whl"
    files = {f"{name}/__init__.py": "VALUE = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def _wheels(folder: Path) -> Path:
    """One good wheel, one for a Python that is not this one, one that is no wheel, one corrupt."""
    folder.mkdir(parents=True)
    _wheel(folder, "suite_probe_pkg", "0.1")
    (folder / f"multiprocess-0.70.19-{NEXT_PY}-none-any.whl").write_bytes(b"never opened")
    (folder / "notes.whl").write_text("not a wheel name")
    (folder / "broken_pkg-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    return folder


def test_dry_run_reports_every_section_with_a_status(tmp_path):
    """`python -m benchmarks.gpu.suite --dry-run` (what CI runs): every section of the first call does its setup in
    a child and reports; the later ones are listed as not selected; each wheel is guarded on its own; both reports
    land."""
    wheels = _wheels(tmp_path / "wheels")
    t = time.monotonic()
    report = _run(tmp_path, "--dry-run", "--wheels", str(wheels), "--budget-scale", "4")
    took = time.monotonic() - t
    s = report["sections"]
    assert list(s) == SECTIONS == [name for name, _, _ in REPORT_SECTIONS]
    assert report["order"] == FIRST
    md = (tmp_path / "gpu_suite.md").read_text()
    for name, title, _ in REPORT_SECTIONS:
        assert f"## {title}" in md, title
        assert s[name]["status"] and s[name]["status"] not in ("pending", "running"), (name, s[name]["status"])
    for name in LATER:
        assert s[name]["status"] == "skipped: not selected"

    by_wheel = {r["wheel"]: r["status"] for r in s["setup"]["rows"]}
    assert by_wheel["notes.whl"] == "skipped: not a wheel file name"
    assert by_wheel[f"multiprocess-0.70.19-{NEXT_PY}-none-any.whl"].startswith(f"skipped: built for {NEXT_PY}-none-any")
    assert by_wheel["broken_pkg-1.0-py3-none-any.whl"].startswith("failed: pip exit"), by_wheel
    # pip's presence from its metadata: find_spec("pip") in this process would switch off setuptools' distutils
    # shim, and a later torch.compile (torchao's 8-bit AdamW in test_memory_tricks.py) then fails to build.
    if _has_distribution("pip"):
        assert by_wheel["suite_probe_pkg-0.1-py3-none-any.whl"] == "installed"
        assert (tmp_path / "work" / "site" / "suite_probe_pkg" / "__init__.py").is_file()
    probe = s["setup"]["probe"]
    assert probe.get("modules", {}).get("slimgrpo", {}).get("ok") or "error" in probe, probe

    # (a) collected from the cuda-marked files alone; on CPU nothing runs
    tests = s["cuda_tests"]
    assert tests["status"] == "ok", tests
    assert tests["rows"][0]["collected"] > 0
    assert set(tests["tasks"][0]["files"]) == set(runner.cuda_test_files()) and "tests/distributed/test_cuda.py" in \
        tests["tasks"][0]["files"]
    # (b) the tiny model, its config and the plan are made; the plan parks the offloaded checkpoints in host RAM
    train = s["train_e2e"]
    assert train["status"] == "ok", train
    assert len(train["rows"]) == 2 and all(r["plan_mib"] > 0 and r["plan_host_mib"] > 0 for r in train["rows"])
    cfg = (tmp_path / "work" / "train_e2e" / "cfg.yaml").read_text()
    for key in ("beta: 0.04", "num_iterations: 2", "budget: auto", "offload_activations: true", "dtype: bfloat16"):
        assert key in cfg, key
    # (c), (d): the outside scripts are present or reported missing, never a crash
    for name in ("bf16_update", "decode"):
        assert s[name]["status"].startswith(("ok", "missing: benchmarks/")), s[name]
    # (e) the Oxen pair, the expandable-segments run and the 8B row, each planned
    mem = s["memory"]
    assert mem["status"] == "ok", mem
    assert [r["task"] for r in mem["rows"]] == ["oxen", "oxen", "oxen (expandable_segments)", "qlora_8b"]
    assert all(r["plan_mib"] > 0 for r in mem["rows"])
    assert mem["rows"][-1]["plan_host_mib"] > 0  # the 24 GB row offloads its checkpoints
    assert s["trl_pair"]["status"].startswith("dry run")
    assert "not evaluated" in md and report["elapsed_s"] <= took + 1


def test_first_call_budgets_fit_the_time_limit():
    """The documented order and budgets: the first call's sections plus the reserve fit 540 s, and the tasks
    inside a section fit its budget."""
    assert sum(BUDGETS[s] for s in FIRST) + RESERVE_S <= 540
    a = gpu_suite.parse_args([])
    for name in FIRST[1:]:
        assert sum(t.budget for t in tasks_of(name, a)) <= BUDGETS[name], name
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    for name in FIRST:
        assert f"`{name}` | {BUDGETS[name]} s" in doc, name


def test_time_left_by_earlier_sections_carries_forward():
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--dry-run", "--time-limit", "100"]))
    suite.end = time.monotonic() + 100
    assert suite.allowed(20, 50) == pytest.approx(100 - RESERVE_S - 50, abs=0.5)  # its 20 + 20 unused before it
    assert suite.allowed(60, 50) == pytest.approx(60, abs=0.5)  # its own budget, though later ones get less
    assert suite.allowed(120, 0) == pytest.approx(100 - RESERVE_S, abs=0.5)  # never more than is left
    suite.end = time.monotonic() - 1
    assert suite.allowed(20, 0) == 0


def test_only_a_probe_that_answered_skips_the_cuda_sections(tmp_path):
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--out", str(tmp_path)]))
    suite.cuda = {"error": "the import probe did not finish in 35 s"}
    assert suite.no_cuda_reason() is None  # a slow probe proves nothing: the sections try and report
    suite.cuda = {"modules": {"torch": {"ok": True}}, "cuda_available": False}
    assert suite.no_cuda_reason() == "no CUDA device (torch sees none)"
    suite.cuda = {"modules": {"torch": {"ok": False, "error": "ImportError: libcudart"}}}
    assert suite.no_cuda_reason() == "torch does not import (ImportError: libcudart)"
    suite.cuda = {"modules": {"torch": {"ok": True}}, "cuda_available": True}
    assert suite.no_cuda_reason() is None


def test_wheel_choice_checks_tags_and_keeps_one_version(tmp_path):
    _wheel(tmp_path, "pkg_a", "1.0")
    _wheel(tmp_path, "pkg_a", "2.0")
    _wheel(tmp_path, "pkg_b", "1.0", tag="cp312-cp312-manylinux_2_17_x86_64")
    tags = {("py3", "none", "any"), ("cp311", "cp311", "manylinux_2_17_x86_64")}
    chosen, rows = setup.choose_wheels(tmp_path, tags)
    assert [(w["name"], w["version"]) for w in chosen] == [("pkg-a", "1.0")]
    status = {r["wheel"]: r["status"] for r in rows}
    assert status["pkg_a-2.0-py3-none-any.whl"].startswith("skipped: a second wheel of pkg-a")
    assert status["pkg_b-1.0-cp312-cp312-manylinux_2_17_x86_64.whl"].startswith("skipped: built for cp312")
    assert setup.install_wheels(tmp_path / "absent", tmp_path / "t", time.monotonic() + 9)[0]["status"] == \
        "skipped: no such folder"


def test_a_hung_child_is_killed_at_its_limit(tmp_path):
    t = time.monotonic()
    rc, took = runner.run_child([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"],
                                _env(), 2.0, tmp_path / "hung.log")
    assert rc is None and took < 15 and time.monotonic() - t < 15
    assert "started" in (tmp_path / "hung.log").read_text()


def test_a_failing_task_is_reported_and_the_section_goes_on(tmp_path):
    """A task whose child raises (here: a task name no child knows) ends as "failed: ..." with the reason,
    and the next task of the section still runs."""
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--device", "cpu", "--out", str(tmp_path), "--work",
                                                  str(tmp_path / "work")]))
    info = suite.task("memory", gpu_suite.Task("no_such_task", budget=120), "no_such_task", 120.0)
    assert info["status"].startswith("failed: ValueError: unknown task 'no_such_task'"), info
    assert info["exit_code"] == 0 and "traceback" in info
    script = gpu_suite.Task("x", "script", 10, script="benchmarks/no_such_script.py")
    assert suite.task("decode", script, "x", 10.0)["status"] == "missing: benchmarks/no_such_script.py is not in this tree"


def test_sigterm_still_leaves_a_report(tmp_path):
    proc = subprocess.Popen([*SUITE, "--dry-run", "--out", str(tmp_path), "--work", str(tmp_path / "work")],
                            env=_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    report_path = tmp_path / "gpu_suite.json"
    deadline = time.monotonic() + 120
    while not report_path.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    report = json.loads(report_path.read_text())
    assert report["stopped"] == "SIGTERM"
    statuses = [report["sections"][n]["status"] for n in FIRST]
    assert not any(st in ("pending", "running") for st in statuses), statuses
    assert any(st.startswith(("stopped: SIGTERM", "not run")) for st in statuses), statuses
    assert (tmp_path / "gpu_suite.md").is_file()


def test_smoke_later_sections_on_tiny_shapes(tmp_path):
    """The later sections (--only, a later GPU call) still run their measurements on tiny shapes on a CPU."""
    from benchmarks.gpu.tasks import planner_runs
    from benchmarks.gpu.workloads import settings

    report = _run(tmp_path, "--device", "cpu", "--smoke", "--only", "loss", "planner")
    s = report["sections"]
    for name in ("loss", "planner"):
        assert s[name]["status"] == "ok", (name, s[name])
        assert s[name]["rows"] and all(r.get("status", "ok") == "ok" for r in s[name]["rows"]), s[name]["rows"]
    assert {r["path"] for r in s["loss"]["rows"]} == {"chunked", "naive"}
    assert all(r["max_abs_logp_diff"] < 1e-4 for r in s["loss"]["rows"])  # fp32 on CPU: the two paths agree
    assert len(s["planner"]["rows"]) == len(planner_runs(settings(True)))
    assert all(r["plan_mib"] > 0 and r["peak_alloc_mib"] is None for r in s["planner"]["rows"])  # no CUDA peak
    assert s["train_e2e"]["status"] == "skipped: not selected"
    assert "not evaluated" in (tmp_path / "gpu_suite.md").read_text()  # a smoke run claims no goal


def test_zero_time_limit_records_every_section_as_skipped(tmp_path):
    report = _run(tmp_path, "--only", "loss", "--time-limit", "0", "--device", "cpu")
    s = report["sections"]
    assert s["cuda_tests"]["status"] == "skipped: not selected"
    assert s["loss"]["status"].startswith("skipped: budget")  # no time left: recorded, not run
    assert s["setup"]["status"].startswith("skipped: budget")


def test_planner_runs_put_trl_pairs_first():
    from benchmarks.gpu.tasks import planner_runs
    from benchmarks.gpu.workloads import settings

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
    report = _run(tmp_path, "--device", "cpu", "--smoke", "--trl", "on", "--only", "planner", "vs_trl")
    rows = report["sections"]["vs_trl"]["rows"]
    assert rows and all(r["status"] == "ok" and r["trl_steps"] >= 1 for r in rows), rows


def test_pinned_host_bytes_add_the_pool_pinned_in_place(monkeypatch):
    """The offload's pool pins in place (cudaHostRegister), which torch.cuda.host_memory_stats() does not
    count: the suite's pinned figure adds both, as the run's memory/pinned_host_peak_mib does."""
    import torch

    from benchmarks.gpu import measure
    from slimgrpo.memory import pinned

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.peak": 2 * 2**20}, raising=False)
    monkeypatch.setattr(pinned, "registered_bytes", lambda: (0, 3 * 2**20))
    stats = measure.host_stats()
    assert stats["pinned_cached_peak_mib"] == 2 and stats["pinned_registered_peak_mib"] == 3
    assert stats["pinned_peak_mib"] == 5


def _has_distribution(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False
