"""The GPU suite (benchmarks/gpu/) off the GPU: the dry run CI runs (both calls' setup, the install guards, the
report), the guards themselves (a hung child is killed at its limit, a crashing task is reported, SIGTERM
still leaves a report, a pytest killed at its limit keeps every finished test's result), the two calls and their
time budgets, the wheel set against the carry limit, and the later sections' --smoke plumbing on tiny shapes."""

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

from benchmarks.gpu import runner, setup, wheels
from benchmarks.gpu import suite as gpu_suite
from benchmarks.gpu.report import SECTIONS as REPORT_SECTIONS
from benchmarks.gpu.suite import (BUDGET_BASIS, BUDGETS, FIRST, FIRST_LIMIT_S, FIRST_TIMEOUT_S, LATER, RESERVE_S,
                                  SECOND, SECOND_LIMIT_S, SECOND_SETUP_S, SECOND_TIMEOUT_S, SECTIONS, tasks_of)

REPO = Path(__file__).resolve().parents[2]
SUITE = [sys.executable, "-m", "benchmarks.gpu.suite"]  # run from the repository root
NEXT_PY = f"py3{sys.version_info.minor + 1}"  # a wheel for the next Python (as multiprocess ships one per version)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]), TQDM_DISABLE="1")
    env.pop("OUT", None)
    return env


def _run(out: Path, *extra: str, timeout: float = 900) -> dict:
    if "--wheels" not in extra:  # not a developer's .whl/: the tests install only the wheels they make
        extra = (*extra, "--wheels", str(out / "no_wheels"))
    proc = subprocess.run([*SUITE, "--out", str(out), "--work", str(out / "work"), *extra],
                          capture_output=True, text=True, env=_env(), cwd=REPO, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out / "stderr.txt").write_text(proc.stderr)
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
    """`python -m benchmarks.gpu.suite --dry-run` (what CI runs): every section of both calls does its setup in
    a child and reports; the later ones are listed as not selected; each wheel is guarded on its own, and a wheel
    of the list that is neither carried nor installed is named; both reports land, with the second call's command."""
    folder = _wheels(tmp_path / "wheels")
    t = time.monotonic()
    report = _run(tmp_path, "--dry-run", "--wheels", str(folder), "--budget-scale", "4")
    took = time.monotonic() - t
    s = report["sections"]
    assert list(s) == SECTIONS == [name for name, _, _ in REPORT_SECTIONS]
    assert report["order"] == FIRST + SECOND and report["call"] == "dry run (both calls)"
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
    for w in wheels.WHEELS:  # the real set is not in the test's folder: each is named unless this Python has it
        assert by_wheel.get(w.file, "").startswith("missing: ") or setup.installed_version(w.name) == w.version, w
    # pip's presence from its metadata: find_spec("pip") in this process would switch off setuptools' distutils
    # shim, and a later torch.compile (torchao's 8-bit AdamW in test_memory_tricks.py) then fails to build.
    if _has_distribution("pip"):
        assert by_wheel["suite_probe_pkg-0.1-py3-none-any.whl"] == "installed"
        assert (tmp_path / "work" / "site" / "suite_probe_pkg" / "__init__.py").is_file()
    probe = s["setup"]["probe"]
    assert probe.get("modules", {}).get("slimgrpo", {}).get("ok") or "error" in probe, probe
    assert "error" in probe or list(probe["modules"]) == list(gpu_suite.probe_names(FIRST + SECOND))
    used = {"trl:GRPOTrainer", "torchao.optim:_AdamW", "bitsandbytes.optim:AdamW8bit"}
    assert used <= set(probe.get("modules", {})) or "error" in probe

    # (a) collected from the cuda-marked files alone; on CPU nothing runs. The testlog plugin names every test,
    # and pytest's JUnit XML lands beside the reports
    tests = s["cuda_tests"]
    assert tests["status"] == "ok", tests
    assert tests["rows"][0]["collected"] > 0 and tests["rows"][0]["source"] == "testlog"
    assert (tmp_path / gpu_suite.JUNIT_NAME).is_file() and tests["rows"][0]["junit"] == gpu_suite.JUNIT_NAME
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
    # (e) the Oxen pair and the expandable-segments run, each planned
    mem = s["memory"]
    assert mem["status"] == "ok", mem
    assert [r["task"] for r in mem["rows"]] == ["oxen", "oxen", "oxen (expandable_segments)"]
    assert all(r["plan_mib"] > 0 for r in mem["rows"])
    assert s["trl_pair"]["status"].startswith("dry run")
    # (g) the second call's 8B row, planned; it offloads its checkpoints to host memory
    big = s["qlora_8b"]
    assert big["status"] == "ok", big
    assert len(big["rows"]) == 1 and big["rows"][0]["plan_mib"] > 0 and big["rows"][0]["plan_host_mib"] > 0
    assert "not evaluated" in md and report["elapsed_s"] <= took + 1
    # the second call's command: in the JSON, the markdown and the last lines of the output
    assert report["next_call"] == gpu_suite.device_call(second=True)
    assert report["next_call"] in md
    assert gpu_suite.device_call(second=True) in (tmp_path / "stderr.txt").read_text().splitlines()[-1]


def test_both_calls_fit_their_limits_and_the_lease():
    """The documented order and budgets: each call's sections plus the reserve fit its --time-limit, each limit
    leaves its device call 30 s (Python's start, the last report, the transfers) within a 10-minute command, the
    two limits and a one-minute start fit the 15 minutes of a lease, and the tasks inside a section fit its
    budget. Every budget states its basis."""
    assert sum(BUDGETS[s] for s in FIRST) + RESERVE_S <= FIRST_LIMIT_S
    assert SECOND_SETUP_S + sum(BUDGETS[s] for s in SECOND) + RESERVE_S <= SECOND_LIMIT_S
    assert FIRST_LIMIT_S + 30 <= FIRST_TIMEOUT_S <= 600 and SECOND_LIMIT_S + 30 <= SECOND_TIMEOUT_S <= 600
    assert 60 + FIRST_LIMIT_S + SECOND_LIMIT_S <= 15 * 60
    a = gpu_suite.parse_args([])
    for name in FIRST[1:] + SECOND:
        assert sum(t.budget for t in tasks_of(name, a)) <= BUDGETS[name], name
    assert set(BUDGET_BASIS) == set(FIRST + SECOND)
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    for name in FIRST + SECOND:
        assert f"`{name}` | {BUDGETS[name]} s" in doc, name
    assert f"`setup` (second call) | {SECOND_SETUP_S} s" in doc


def test_the_second_call_is_its_own_command():
    """`--second` runs the setup and the heaviest row alone, on its own time limit; the first call's report names
    it (a dry run sets up both); the docs give both device calls exactly as the suite prints them."""
    second = gpu_suite.Suite(gpu_suite.parse_args(["--second"]))
    assert second.wanted == ["setup", *SECOND] and second.a.time_limit == SECOND_LIMIT_S
    assert second.report["budgets"] == {"setup": SECOND_SETUP_S, **{s: BUDGETS[s] for s in SECOND}}
    assert second.report["next_call"] is None and second.call == "second"
    first = gpu_suite.Suite(gpu_suite.parse_args([]))
    assert first.wanted == FIRST and first.a.time_limit == FIRST_LIMIT_S and not set(SECOND) & set(first.wanted)
    assert first.report["next_call"] == gpu_suite.device_call(second=True)
    assert gpu_suite.Suite(gpu_suite.parse_args(["--only", "loss"])).report["next_call"] is None
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--second", "--only", "loss"])
    call = gpu_suite.device_call(second=True)
    assert "--second" in call and f"--time-limit {SECOND_LIMIT_S:.0f}" in call
    assert f"timeout_s={SECOND_TIMEOUT_S}" in call
    for second_call in (False, True):
        assert len(gpu_suite.suite_command(second_call)) <= 2000  # the device tool's limit on a command
        assert gpu_suite.device_call(second_call) in (REPO / "docs" / "benchmarks.md").read_text()


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


CUDA_TESTS = """import os, time
import pytest

pytestmark = pytest.mark.cuda


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_passes():
    assert True


def test_fails():
    assert 1 == 2, "one is not two"


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass


def test_setup_error(broken):
    pass


def test_hangs():
    if os.environ.get("HANG"):
        time.sleep(600)
"""


def _test_file(tmp_path: Path) -> Path:
    path = tmp_path / "cuda_like" / "test_cuda_like.py"
    path.parent.mkdir(parents=True)
    path.write_text(CUDA_TESTS)
    return path


def test_cuda_tests_killed_at_the_limit_keep_every_finished_result(tmp_path, monkeypatch):
    """The cuda_tests section's pytest, stopped at its limit inside a test: pytest prints no closing line and writes
    no JUnit XML, yet the report has each finished test's outcome (from the testlog plugin's lines), the test it
    was stopped in and how many never started."""
    path = _test_file(tmp_path)
    monkeypatch.setattr(gpu_suite, "cuda_test_files", lambda: [str(path)])
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--device", "cpu", "--out", str(tmp_path / "out"), "--work",
                                                  str(tmp_path / "work")]))
    suite.env["HANG"] = "1"
    info = suite.task("cuda_tests", gpu_suite.Task("pytest", "pytest", 20), "pytest", 20.0)
    row = info["rows"][0]
    assert info["exit_code"] is None, info  # killed at the limit
    assert not (tmp_path / "out" / gpu_suite.JUNIT_NAME).exists()  # pytest never got to write it
    outcomes = {t["test"].rsplit("::", 1)[-1]: t["outcome"] for t in row["tests"]}
    assert outcomes == {"test_passes": "passed", "test_fails": "failed", "test_skipped": "skipped",
                        "test_setup_error": "error", "test_hangs": "running when stopped"}, row["tests"]
    assert (row["passed"], row["failed"], row["skipped"], row["error"]) == (1, 1, 1, 1)
    assert row["collected"] == 5 and row["finished"] == 4 and row["not_started"] == 0
    assert row["running"].endswith("::test_hangs") and row["source"] == "testlog"
    assert info["status"].startswith("stopped: budget (20 s) after 4 of 5 tests; failed: test_fails, test_setup_error")
    assert info["status"].endswith("stopped in " + row["running"])
    fails = next(t for t in row["tests"] if t["test"].endswith("test_fails"))
    assert "one is not two" in fails["message"]
    from benchmarks.gpu.report import _cuda_tests

    md = "\n".join(_cuda_tests(info["rows"]))
    assert "running when stopped" in md and "Stopped at the limit inside" in md and "no JUnit XML" in md


def test_cuda_tests_junit_and_testlog_agree(tmp_path, monkeypatch):
    """A pytest that ends: its JUnit XML (in the output folder) and the testlog lines give the same outcome for
    every test, and the report reads the XML where the testlog is absent."""
    path = _test_file(tmp_path)
    monkeypatch.setattr(gpu_suite, "cuda_test_files", lambda: [str(path)])
    suite = gpu_suite.Suite(gpu_suite.parse_args(["--device", "cpu", "--out", str(tmp_path / "out"), "--work",
                                                  str(tmp_path / "work")]))
    suite.env.pop("HANG", None)
    info = suite.task("cuda_tests", gpu_suite.Task("pytest", "pytest", 120), "pytest", 120.0)
    assert info["exit_code"] == 1 and info["status"].startswith("failed: pytest exit 1; failed: test_fails"), info
    junit = tmp_path / "out" / gpu_suite.JUNIT_NAME
    from_log = runner.tests_from_log(suite.logs / "cuda_tests.jsonl")
    from_xml = runner.tests_from_junit(junit)
    assert {t["test"]: t["outcome"] for t in from_log["tests"]} == {t["test"]: t["outcome"] for t in from_xml["tests"]}
    assert sorted(t["outcome"] for t in from_xml["tests"]) == ["error", "failed", "passed", "passed", "skipped"]
    res = runner.test_results(tmp_path / "no_such.jsonl", junit, "")
    assert res["source"] == "junit" and (res["passed"], res["failed"], res["skipped"], res["error"]) == (2, 1, 1, 1)
    res = runner.test_results(tmp_path / "no_such.jsonl", tmp_path / "no_such.xml",
                              (suite.logs / "cuda_tests-pytest.log").read_text())
    assert res["source"] == "pytest -v output" and res["failed"] == 1 and res["passed"] == 2


def test_the_wheel_set_fits_the_carry_limit_and_its_requirements(tmp_path):
    """benchmarks/gpu/wheels.py's list with the working tree fits the 64 MiB a device call carries; the fetch
    script downloads that list; `check` names a missing, resized or unlisted wheel and a requirement that neither
    the lent image nor the list provides."""
    assert {w.name for w in wheels.WHEELS} == {"trl", "datasets", "dill", "multiprocess", "torchao", "bitsandbytes"}
    assert wheels.total_bytes() + wheels.tree_bytes(REPO) <= wheels.LIMIT_MIB * 2**20
    assert wheels.total_bytes(no_bnb=True) < wheels.total_bytes() - 40 * 2**20  # bitsandbytes: ~41 MiB of it
    script = (REPO / "scripts" / "fetch_gpu_wheels.sh").read_text()
    assert "-m benchmarks.gpu.wheels pins" in script and "-m benchmarks.gpu.wheels check" in script
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    for w in wheels.WHEELS:
        assert f"| `{w.file}` | {w.size / 2**20:.2f} MiB |" in doc, w.file
    assert f"{wheels.total_bytes() / 2**20:.2f} MiB" in doc

    folder = tmp_path / "whl"
    folder.mkdir()
    for w in wheels.WHEELS:  # sparse files of the recorded sizes: the names and sizes are what check reads first
        with open(folder / w.file, "wb") as f:
            f.truncate(w.size)
    lines, ok = wheels.check(folder, REPO)
    assert not ok and all("unreadable" in ln for ln in lines[:-1]), lines  # not zip files: flagged, never passed
    for w in wheels.WHEELS:
        (folder / w.file).unlink()
        _sized_wheel(folder, w)
    lines, ok = wheels.check(folder, REPO)
    assert ok, lines
    assert "under the 64 MiB" in lines[-1]
    (folder / wheels.WHEELS[0].file).unlink()
    _wheel(folder, "extra_pkg", "1.0")
    lines, ok = wheels.check(folder, REPO)
    assert not ok and any("MISSING" in ln for ln in lines) and any("NOT IN THE LIST" in ln for ln in lines)

    needy = tmp_path / "needy-1.0-py3-none-any.whl"
    with zipfile.ZipFile(needy, "w") as z:
        z.writestr("needy-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: needy\nVersion: 1.0\n"
                   "Requires-Dist: numpy>=1\nRequires-Dist: dill<0.5\nRequires-Dist: not-in-image\n"
                   "Requires-Dist: sphinx; extra == 'docs'\n")
    assert wheels.unmet(needy) == ["not-in-image"]  # numpy: the image; dill: the list; sphinx: an extra


def _sized_wheel(folder: Path, w: "wheels.Wheel") -> Path:
    """A wheel named as ``w`` (no requirements) of exactly its recorded size: a stored member pads it."""
    tag = w.file.split("-", 2)[2].removesuffix(".whl")
    path = _wheel(folder, w.name.replace("-", "_"), w.version, tag=tag)
    assert path.name == w.file
    data = path.read_bytes()
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_STORED) as z:
        z.writestr("pad", b"")
    overhead = path.stat().st_size
    path.write_bytes(data)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_STORED) as z:
        z.writestr("pad", bytes(w.size - overhead))
    assert path.stat().st_size == w.size
    return path


def test_a_second_call_keeps_the_wheels_an_earlier_call_installed(tmp_path):
    """On a warm machine the second call finds the first call's wheels in the private folder and installs
    nothing again."""
    if not _has_distribution("pip"):
        pytest.skip("this interpreter has no pip")
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "suite_probe_pkg", "0.1")
    _wheel(folder, "suite_probe_two", "0.2")
    target = tmp_path / "site"
    first = {r["wheel"]: r["status"] for r in setup.install_wheels(folder, target, time.monotonic() + 120)}
    assert first["suite_probe_pkg-0.1-py3-none-any.whl"].startswith("installed"), first
    again = {r["wheel"]: r["status"] for r in setup.install_wheels(folder, target, time.monotonic() + 120)}
    kept = "present: installed in the wheels' folder by an earlier call"
    assert again["suite_probe_pkg-0.1-py3-none-any.whl"] == again["suite_probe_two-0.2-py3-none-any.whl"] == kept
    assert setup.target_version(target, "suite-probe-pkg") == "0.1"


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


def test_a_signal_during_an_install_is_not_swallowed(tmp_path, monkeypatch):
    """SIGTERM raises Stop in the driver wherever it is; a pip call's guard must let it through, or the suite
    would run on after it was told to stop."""
    _wheels(tmp_path / "wheels")

    def stopped(*args, **kwargs):
        raise runner.Stop("SIGTERM")

    monkeypatch.setattr(setup, "pip_install", stopped)
    with pytest.raises(runner.Stop):
        setup.install_wheels(tmp_path / "wheels", tmp_path / "site", time.monotonic() + 60)


def test_sigterm_still_leaves_a_report(tmp_path):
    proc = subprocess.Popen([*SUITE, "--dry-run", "--out", str(tmp_path), "--work", str(tmp_path / "work"),
                             "--wheels", str(tmp_path / "no_wheels")],
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
