"""Every GPU figure of slimgrpo in two guarded calls: one JSON and one markdown report each, whatever happens.

    python3 -m benchmarks.gpu.suite --out $OUT --time-limit 570           (the lent GPU: the first call)
    python3 -m benchmarks.gpu.suite --second --out $OUT --time-limit 240  (the second call, right after it)
    python -m benchmarks.gpu.suite --dry-run --out DIR                    (CI, CPU: both calls' setup, guards, report)
    python3 -m benchmarks.gpu.suite --only planner vs_trl --out $OUT      (a later lease: other sections)
    python -m benchmarks.gpu.suite --device cpu --smoke --only loss       (a later section on tiny shapes)

Run from the repository root (the device tool's working folder). A lent machine gives a session 15 minutes of
device time, start-up included, and at most 10 minutes a command: the first call (FIRST, ``--time-limit 570``)
holds every section that fits 9.5 minutes; the heaviest row, the 24 GB Qwen3-8B QLoRA step (SECOND), is a second
call of its own (``--second``, 240 s), whose exact command the first call prints last (``next_call``).
docs/benchmarks.md#gpu-suite says what to run, in which order, and where each figure goes.

The first call, in this order (budget in seconds on one H100: 545 in all plus RESERVE_S within 570; a section
that ends early leaves its time to those after it; the basis of each estimate is in BUDGET_BASIS):

  setup        40  wheels from --wheels (default .whl/), each checked against this Python's tags and
                   installed with a timeout (all in one pip call, one by one if that fails; skipped when an
                   earlier call on the same machine installed them); the modules the call's sections use
                   imported in a child
  cuda_tests   80  (a) ``pytest -m cuda`` on the files that hold cuda-marked tests, nothing else collected; one
                   line per test as it ends (benchmarks/gpu/testlog.py) and --junitxml into --out, so a kill
                   at the limit keeps every finished test's result
  train_e2e    70  (b) ``slimgrpo train`` on a tiny random model: bf16 LoRA, beta 0.04, num_iterations 2,
                   completions that stop at EOS, checkpoints, memory.budget=auto, checkpoints offloaded to
                   pinned host memory; then one step resumed in a new process. Plan against peak
                   allocated, peak reserved and pinned host bytes
  bf16_update  60  (c) benchmarks/update/bf16_update.py: the bf16 full-fine-tuning update check, torchao's
                   stochastic rounding included ("missing" if absent)
  decode       55  (d) benchmarks/rollout/decode_graphs.py --budget-s (the task's time less 15 s): eager vs
                   CUDA graphs, LoRA and QLoRA ("missing" if absent)
  memory      100  (e) the Oxen rows (Qwen2.5-0.5B shape, full and LoRA) against the plan; the full row
                   again with expandable_segments (reserved / allocated)
  trl_pair    140  (f) TRL 1.16 on the 0.5B pair, beside the Oxen rows

The second call (``--second``; 230 in all plus RESERVE_S within 240):

  setup        25  as above; the wheels the first call installed are kept on the warm machine
  qlora_8b    205  (g) the 24 GB Qwen3-8B QLoRA row of docs/benchmarks.md#issue-29-now: a random 16 GB bf16
                   base saved, loaded in 4-bit, one update of 2 x (256 + 71,934) tokens, offloaded
                   checkpoints, 8-bit AdamW; device peak and pinned host bytes against the plan

Later sections, by ``--only`` in a later lease: loss, update_only_long, quantized, rollout, planner, vs_trl,
long_context (docs/benchmarks.md#gpu-suite).

Every install, section and task is guarded: each task is a child process with a wall-clock limit (its
process group is killed at the limit), its failure or its timeout is written into the report and the
suite goes on. The report is written before the first section and rewritten after every task, and on
SIGTERM / SIGINT. This process imports neither torch nor the project.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu import setup  # (no torch, no project import: nor anything below)
from benchmarks.gpu.runner import (_CURRENT, Stop, _on_signal, cuda_test_files, kill_group, last_error,  # noqa: F401
                                   pytest_row, pytest_status, pytest_summary, read_json, rows_of, run_child)
from benchmarks.gpu.testlog import ENV as TESTLOG_ENV
from benchmarks.harness.measure import tail
from benchmarks.harness.paths import REPO_ROOT as REPO
from benchmarks.harness.processes import child_command, module_command

FIRST = ["setup", "cuda_tests", "train_e2e", "bf16_update", "decode", "memory", "trl_pair"]
SECOND = ["qlora_8b"]  # the second call: setup, then these
LATER = ["loss", "update_only_long", "quantized", "rollout", "planner", "vs_trl", "long_context"]
SECTIONS = FIRST + SECOND + LATER
# Seconds per section on one H100 (estimates: BUDGET_BASIS says from what). The first call's sum (545) plus
# RESERVE_S fits FIRST_LIMIT_S; the second call's setup (SECOND_SETUP_S) and sections plus RESERVE_S fit
# SECOND_LIMIT_S; the later sections are sized for calls of their own.
BUDGETS = {"setup": 40, "cuda_tests": 80, "train_e2e": 70, "bf16_update": 60, "decode": 55, "memory": 100,
           "trl_pair": 140,
           "qlora_8b": 205,
           "loss": 20, "update_only_long": 100, "quantized": 35, "rollout": 40, "planner": 140, "vs_trl": 125,
           "long_context": 520}
SECOND_SETUP_S = 25  # the second call's setup: the wheels are in place on the warm machine, fewer imports
RESERVE_S = 10.0  # kept for the last report and the children's logs
# The device tool: 15 minutes of device time a session (start-up included), 10 minutes a command. The first
# call's suite stops by 570 s, the second's by 240 s; each call's timeout_s leaves 30 s for Python's start, the
# last report and the transfers.
FIRST_LIMIT_S, SECOND_LIMIT_S = 570.0, 240.0
FIRST_TIMEOUT_S, SECOND_TIMEOUT_S = 600, 270
# Where each estimate comes from. "CPU dry run": the lent-mimic venv (Python 3.12, torch 2.11.0+cu130 on CPU,
# transformers 5.17.0, the .whl set) on this project's 2-core machine under load 7, docs/benchmarks.md#gpu-suite.
# GPU figures: KINDS.md's readings of the lent H100 / H200 (bf16 matmul ~790 TFLOP/s, 3-4 TB/s, 16 cores).
BUDGET_BASIS = {
    "setup": "CPU dry run 31 s (pip of 46 MiB of wheels + importing torch, transformers, peft, datasets, trl, "
             "torchao, bitsandbytes, slimgrpo on 2 loaded cores); 16 free cores and CUDA's own start: ~25 s",
    "cuda_tests": "CPU dry run: collecting the 12 tests 12-26 s; on the GPU ~8 s of imports, then 12 small tests "
                  "(a 0.5B update, a tiny QLoRA step, bitsandbytes' 8-bit AdamW, four CUDA-graph captures, the "
                  "offload twins) at 2-6 s each: 45-65 s",
    "train_e2e": "two `slimgrpo train` processes (~8 s of imports each) on a 4-layer model: 4 steps of 16 x 96 "
                 "tokens (~1 s of decode a step), then 1 resumed step: 25-35 s + 15-20 s",
    "bf16_update": "a 1-layer 32M model, 10 steps x 2 learning rates x 4 variants (ms each); torchao compiles "
                   "its stochastic-rounding step with triton per tensor shape (6 shapes, 2-3 compiles of "
                   "10-20 s): 35-55 s with the imports",
    "decode": "self-limited: the script gets --budget-s (its time less 15 s) and skips the rows left",
    "memory": "Oxen rows, 2 steps each: decoding 4 x 786 tokens eager on a 24-layer 0.5B model at 10-15 ms a "
              "token is 8-12 s a step; full + LoRA = 4 steps (oxen 65 s with the child's start), the full row "
              "again with expandable segments (35 s)",
    "trl_pair": "TRL 1.16 GRPOTrainer in a child per run (~15 s of imports and setup), 2 steps of HF generate "
                "4 x 786 tokens at 20-25 ms a token (16-20 s a step): 50-55 s a run, full + LoRA",
    "qlora_8b": "random bf16 Qwen3-8B (8.2B parameters) made on the GPU and saved (16.4 GB, disk ~1-2 GB/s: "
                "15-30 s), loaded in 4-bit (20-40 s), one update of 2 x 72,190 tokens: ~6e15 FLOPs of "
                "linears with the recompute + ~1.4e16 of attention at 72K context, at 250-400 TFLOP/s: 50-80 s; "
                "100-160 s with the child's start",
}
SMOKE_BUDGET_S = 120.0  # --smoke on a CPU: every section gets this much
SCRIPT_STARTUP_S = 15.0  # an outside script's imports and model setup, before its own --budget-s counts
CHILD_LOG_CAP = 400_000  # bytes of one task's log copied into gpu_suite_children.log (head and tail)
JUNIT_NAME = "cuda_tests.xml"  # in --out, beside the reports: the tool brings back 8 files at most
# What each section imports, probed in the setup's child (one per call: the second call's is short).
PROBES = {
    "setup": ("torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "slimgrpo"),
    "cuda_tests": ("pytest", "bitsandbytes", "bitsandbytes.optim:AdamW8bit", "torchao"),
    "train_e2e": ("slimgrpo.commands.cli:main",),
    "bf16_update": ("torchao.optim:_AdamW", "torchao.optim:AdamW8bit"),
    "decode": ("bitsandbytes", "transformers:BitsAndBytesConfig"),
    "trl_pair": ("pyarrow", "datasets:load_dataset", "trl:GRPOConfig", "trl:GRPOTrainer", "peft:LoraConfig"),
    "qlora_8b": ("bitsandbytes", "bitsandbytes.optim:AdamW8bit", "transformers:BitsAndBytesConfig"),
    "quantized": ("bitsandbytes", "bitsandbytes.optim:AdamW8bit"),
    "vs_trl": ("datasets:load_dataset", "trl:GRPOConfig", "trl:GRPOTrainer", "peft:LoraConfig"),
    "long_context": ("bitsandbytes", "transformers:BitsAndBytesConfig"),
}


def suite_command(second: bool = False) -> str:
    """The shell command of a device call: the suite, its output also kept in $OUT (it comes back on a kill)."""
    which = f"--second --out $OUT --time-limit {SECOND_LIMIT_S:.0f}" if second else \
        f"--out $OUT --time-limit {FIRST_LIMIT_S:.0f}"
    return f"set -o pipefail; PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu.suite {which} 2>&1 | tee $OUT/gpu_suite.log"


def device_call(second: bool = False) -> str:
    """The device tool's call, as docs/benchmarks.md#gpu-suite gives it (the command is far under 2,000 chars)."""
    timeout = SECOND_TIMEOUT_S if second else FIRST_TIMEOUT_S
    return f'run(timeout_s={timeout}, carry=[".whl"], command="{suite_command(second)}")'


def probe_names(sections: list[str]) -> tuple[str, ...]:
    """The modules the setup's child imports for ``sections``, each once, in order."""
    out: list[str] = []
    for name in ["setup", *sections]:
        out += [m for m in PROBES.get(name, ()) if m not in out]
    return tuple(out)


@dataclass
class Task:
    """One child process of a section: ``kind`` "child" (``benchmarks.children.gpu_task TASK``), "script" (a
    benchmark module of its own writing --json PATH, ``script`` its file) or "pytest"; ``budget`` its share of
    the section (seconds)."""

    name: str
    kind: str = "child"
    budget: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    script: str = ""
    args: list[str] = field(default_factory=list)


def tasks_of(section: str, a: argparse.Namespace) -> list[Task]:
    b = BUDGETS[section]
    device = "cuda" if a.dry_run else a.device  # a dry run names the GPU call's commands
    if section == "cuda_tests":
        return [Task("pytest", "pytest", b)]
    if section == "train_e2e":
        return [Task("train", budget=40), Task("resume", budget=30)]
    if section == "bf16_update":
        return [Task("bf16_update", "script", b, script="benchmarks/update/bf16_update.py",
                     args=["--device", device, "--steps", "10"])]
    if section == "decode":
        # its own --budget-s: it skips the rows left before the suite's limit kills it ({budget_s}: set per call)
        return [Task("decode", "script", b, script="benchmarks/rollout/decode_graphs.py",
                     args=["--device", device, "--budget-s", "{budget_s}"])]
    if section == "memory":
        return [Task("oxen", budget=65),
                Task("oxen", budget=35, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})]
    return [Task(section, budget=b)]  # trl_pair, qlora_8b and the later sections: one child each


# ----------------------------------------------------------------------------- sections


class Suite:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.monotonic()
        self.end = self.t0 + a.time_limit
        self.out = Path(a.out)
        self.work = Path(a.work)
        self.logs = self.work / "logs"
        self.target = self.work / "site"  # the wheels' private folder (first on the children's PYTHONPATH)
        self.env = setup.child_env(self.target)
        self.cuda = None  # what the import probe said
        self.batch: subprocess.Popen | None = None  # --dry-run: the one child of every task's setup
        self.batch_done: tuple[int | None, float] | None = None
        chosen = a.only or (SECOND if a.second else FIRST + SECOND if a.dry_run else FIRST)
        wanted = [s for s in SECTIONS if (s in chosen or s == "setup") and s not in a.skip]
        self.wanted = wanted
        self.call = "only" if a.only else "second" if a.second else "dry run (both calls)" if a.dry_run else "first"
        self.report: dict[str, Any] = {
            "suite": "slimgrpo gpu_suite", "call": self.call, "dry_run": a.dry_run, "smoke": a.smoke,
            "device": a.device, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "time_limit_s": a.time_limit, "argv": sys.argv[1:], "order": wanted,
            "budgets": {s: self.budget(s) for s in wanted},
            "next_call": device_call(second=True) if self.call in ("first", "dry run (both calls)") else None,
            "sections": {s: {"status": "pending" if s in wanted else "skipped: not selected", "rows": [],
                             "seconds": 0.0} for s in SECTIONS}}

    # -- report

    def write(self) -> None:
        """JSON and markdown, each written to a temporary name and renamed; a markdown that cannot be
        rendered says why and the JSON still lands."""
        self.report["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            _atomic(self.out / "gpu_suite.json", json.dumps(self.report, indent=2, default=str))
        except Exception as e:
            print(f"gpu_suite: could not write the JSON report: {e}", file=sys.stderr)
        try:
            from benchmarks.gpu.report import markdown

            md = markdown(self.report)
        except Exception:
            md = "# slimgrpo GPU suite\n\nThe markdown report failed to render; gpu_suite.json has every figure.\n\n" \
                 "```\n" + traceback.format_exc()[-2000:] + "```\n"
        try:
            _atomic(self.out / "gpu_suite.md", md)
        except Exception as e:
            print(f"gpu_suite: could not write the markdown report: {e}", file=sys.stderr)

    def copy_log(self, label: str, log: Path) -> None:
        """A task's log into $OUT/gpu_suite_children.log (one file, so $OUT stays within the tool's 8)."""
        try:
            data = log.read_bytes()
            if len(data) > CHILD_LOG_CAP:
                half = CHILD_LOG_CAP // 2
                data = data[:half] + b"\n[... cut ...]\n" + data[-half:]
            with open(self.out / "gpu_suite_children.log", "ab") as f:
                f.write(f"\n===== {label} ({log.name}) =====\n".encode() + data)
        except OSError:
            pass

    # -- time

    def allowed(self, budget: float, later: float) -> float:
        """Seconds for the next piece: its budget plus what earlier pieces left unused, never more than
        the time left less the budgets of the pieces after it (when that leaves more than its own)."""
        left = self.end - time.monotonic() - RESERVE_S
        return max(min(left, max(budget, left - later)), 0.0)

    # -- sections

    def run(self) -> None:
        self.write()
        for i, name in enumerate(self.wanted):
            sec = self.report["sections"][name]
            later = sum(self.scaled(s) for s in self.wanted[i + 1:])
            allowed = self.allowed(self.scaled(name), later)
            sec.update(budget_s=round(allowed, 1), status="running")
            start = time.monotonic()
            print(f"[{start - self.t0:6.0f} s] {name} (up to {allowed:.0f} s)", file=sys.stderr, flush=True)
            try:
                if allowed < 1:
                    sec["status"] = "skipped: budget (suite time limit reached)"
                elif name == "setup":
                    self.setup(sec, start + allowed)
                elif self.no_cuda_reason() and name != "cuda_tests":
                    sec["status"] = f"skipped: {self.no_cuda_reason()}"
                else:
                    self.section(name, sec, start + allowed)
            except Stop as e:
                sec["status"] = f"stopped: {e} reached the suite"
                self.finish(sec, start)
                raise
            except Exception as e:  # a bug of the driver itself: the section says so, the suite goes on
                sec["status"] = f"failed: driver error {type(e).__name__}: {e}"[:400]
                sec["traceback"] = traceback.format_exc()[-3000:]
            self.finish(sec, start)

    def budget(self, name: str) -> float:
        """A section's budget in this call (the second call's setup is a short one)."""
        return SECOND_SETUP_S if name == "setup" and self.call == "second" else BUDGETS[name]

    def scaled(self, name: str) -> float:
        b = self.budget(name) * self.a.budget_scale
        return max(b, SMOKE_BUDGET_S * len(tasks_of(name, self.a))) if self.a.smoke else b

    def task_budget(self, task: Task) -> float:
        b = task.budget * self.a.budget_scale
        return max(b, SMOKE_BUDGET_S) if self.a.smoke else b

    def finish(self, sec: dict, start: float) -> None:
        sec["seconds"] = round(time.monotonic() - start, 1)
        print(f"         -> {sec['status']} ({sec['seconds']} s)", file=sys.stderr, flush=True)
        self.write()

    def no_cuda_reason(self) -> str | None:
        """Why the CUDA sections cannot run, as the import probe saw it; None when they can, or when the probe
        itself did not answer (too slow, say): then each section tries and reports for itself."""
        if self.a.device != "cuda" or self.a.dry_run or self.cuda is None or "error" in self.cuda:
            return None
        torch_mod = self.cuda.get("modules", {}).get("torch", {})
        if not torch_mod.get("ok", True):
            return f"torch does not import ({torch_mod.get('error')})"
        if self.cuda.get("cuda_available"):
            return None
        return "no CUDA device (" + (self.cuda.get("cuda_error") or "torch sees none") + ")"

    def setup(self, sec: dict, deadline: float) -> None:
        a = self.a
        wheels = Path(a.wheels) if a.wheels else (REPO / ".whl" if (REPO / ".whl").is_dir() else None)
        sec["env"] = {"python": sys.version.split()[0], "executable": sys.executable,
                      "nvidia_smi": setup.nvidia_smi() if not a.dry_run else None,
                      "wheels_folder": str(wheels) if wheels else None, "wheel_target": str(self.target)}
        # Two-thirds of the setup for the wheels; the import probe gets the rest (at least 30 s).
        install_deadline = time.monotonic() + max((deadline - time.monotonic()) * 2 / 3, 5.0)
        sec["rows"] = setup.install_wheels(wheels, self.target, install_deadline)
        self.write()
        if a.dry_run:
            self.start_batch()
        names = probe_names(self.wanted)
        probe = setup.probe_imports(self.env, max(deadline - time.monotonic(), 30.0), names)
        self.cuda = probe
        sec["probe"] = probe
        mods = probe.get("modules", {})
        failed = [n for n, m in mods.items() if not m.get("ok")]
        bad_wheels = [r["wheel"] for r in sec["rows"]
                      if str(r.get("status", "")).startswith(("failed", "skipped: built", "missing"))]
        gpu = probe.get("gpu") or "no GPU"
        sec["line"] = (f"Python {probe.get('python', sec['env']['python'])}, torch {mods.get('torch', {}).get('version')}, "
                       f"CUDA {probe.get('torch_cuda')}, {gpu} ({probe.get('gpu_mib', '-')} MiB), "
                       f"nvidia-smi: {sec['env']['nvidia_smi'] or '-'}")
        problems = ([f"probe: {probe['error']}"] if probe.get("error") else []) + \
                   ([f"not importable: {', '.join(failed)}"] if failed else []) + \
                   ([f"wheels not installed: {', '.join(bad_wheels)}"] if bad_wheels else [])
        sec["status"] = "ok" if not problems else "partial: " + "; ".join(problems)

    def section(self, name: str, sec: dict, deadline: float) -> None:
        tasks = tasks_of(name, self.a)
        statuses = []
        sec["tasks"] = []
        for j, task in enumerate(tasks):
            left = deadline - time.monotonic()
            later = sum(self.task_budget(t) for t in tasks[j + 1:])
            seconds = max(min(left, max(self.task_budget(task), left - later)), 0.0)
            label = task.name + (" (expandable_segments)" if task.env else "")
            if seconds < 1:
                info = {"task": label, "status": "skipped: budget"}
            else:
                info = self.task(name, task, label, seconds)
            sec["tasks"].append(info)
            sec["rows"] += [{**r, "task": label} for r in info.pop("rows", [])]
            statuses.append((label, info["status"]))
            self.write()
        bad = [(lbl, st) for lbl, st in statuses if not st.startswith("ok")]
        if not bad:
            sec["status"] = "ok"
        elif len(tasks) == 1:
            sec["status"] = bad[0][1]
        else:
            sec["status"] = "; ".join(f"{lbl}: {st}" for lbl, st in bad)[:600]

    def task(self, section: str, task: Task, label: str, seconds: float) -> dict:
        a = self.a
        log = self.logs / f"{section}-{label.split()[0]}{'-exp' if task.env else ''}.log"
        log.unlink(missing_ok=True)
        info: dict[str, Any] = {"task": label, "limit_s": round(seconds, 1)}
        env = {**self.env, **task.env}
        result_path = self.result_path(section, task)
        result_path.parent.mkdir(parents=True, exist_ok=True)
        if not (a.dry_run and task.kind == "child"):  # the dry run's batch child has made (or is making) it
            result_path.unlink(missing_ok=True)
        if task.kind == "pytest":
            files = cuda_test_files()
            info["files"] = files
            if not files:
                info["status"] = "failed: no test file holds a cuda-marked test"
                return info
            testlog, junit = self.logs / "cuda_tests.jsonl", self.out / JUNIT_NAME
            for f in (testlog, junit):
                f.unlink(missing_ok=True)
            testlog.parent.mkdir(parents=True, exist_ok=True)
            env[TESTLOG_ENV] = str(testlog)
            # -v: a line per test as it ends (in the children's log); the testlog plugin: the same as JSON for
            # the report, read back even when the limit kills pytest; --junitxml: written when pytest ends
            cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-v", "-rfEs", "--durations=0",
                   "-p", "no:cacheprovider", "-p", "benchmarks.gpu.testlog", f"--junitxml={junit}",
                   "-o", "junit_family=xunit1", *(["--collect-only"] if a.dry_run else []), *files]
        elif task.kind == "script":
            script = REPO / task.script
            if not script.is_file():
                info["status"] = f"missing: {task.script} is not in this tree"
                return info
            budget_s = str(int(max(seconds - SCRIPT_STARTUP_S, 10)))
            cmd = module_command(_module_of(task.script), *[x.replace("{budget_s}", budget_s) for x in task.args],
                                 "--json", result_path)
            info["command"] = " ".join(cmd[1:])
            if a.dry_run:
                info["status"] = "ok"
                info["rows"] = [{"dry_run": f"present; the GPU call runs: python {' '.join(cmd[1:])}"}]
                return info
        else:
            if a.dry_run and section in LATER:
                info["status"] = "ok"
                info["rows"] = [{"dry_run": "a later section: runs on tiny shapes with --device cpu --smoke"}]
                return info
            if a.dry_run:  # one child does every task's setup (started with the setup); read this task's result
                first = self.batch_done is None
                rc, took = self.wait_batch()
                info.update(exit_code=rc, seconds=round(took, 1) if first else 0.0, batched=True)
                return self.child_result(info, result_path, rc, tail(self.logs / "dry_run_batch.log"), seconds)
            ctx_path = self.write_ctx(task, result_path, seconds)
            cmd = child_command("gpu_task", task.name, ctx_path, result_path)
        rc, took = run_child(cmd, env, seconds, log)
        info.update(exit_code=rc, seconds=round(took, 1))
        text = tail(log, 200_000)
        info["log_tail"] = text[-3000:]
        self.copy_log(f"{section} / {label}", log)
        if task.kind == "pytest":
            info["rows"] = [pytest_row(text, a.dry_run, rc, self.logs / "cuda_tests.jsonl", self.out / JUNIT_NAME)]
            info["status"] = pytest_status(info["rows"][0], rc, seconds, a.dry_run, text)
            return info
        if task.kind == "script":
            data = read_json(result_path)
            info["rows"] = rows_of(data)
            if rc is None:
                info["status"] = f"stopped: budget ({seconds:.0f} s)"
            elif rc != 0:
                info["status"] = f"failed: exit {rc}: {last_error(text)}"[:400]
            elif data is None:
                info["status"] = "failed: the script wrote no JSON"
            else:
                bad = [r for r in info["rows"] if str(r.get("status", "ok")).startswith(("failed", "skipped"))]
                info["status"] = "ok" if not bad else f"partial: {len(bad)} of {len(info['rows'])} rows " \
                                                      f"failed or skipped (first: {bad[0]['status']})"[:400]
            return info
        return self.child_result(info, result_path, rc, text, seconds)

    def child_result(self, info: dict, result_path: Path, rc: int | None, text: str, seconds: float) -> dict:
        """A ``gpu_task`` child's report entry from its result file, its exit code and its log."""
        data = read_json(result_path)
        data = data if isinstance(data, dict) else {}
        info["rows"] = data.get("rows", [])
        for key in ("traceback",):
            if key in data:
                info[key] = data[key]
        status = data.get("status")
        if rc is None:
            info["status"] = f"stopped: budget ({seconds:.0f} s)"
        elif status is None:
            info["status"] = f"failed: exit {rc} with no result: {last_error(text)}"[:400]
        elif status == "running":
            info["status"] = f"failed: exit {rc} midway: {last_error(text)}"[:400]
        else:
            info["status"] = status
        if info["status"] == "ok" and any(str(r.get("status", "ok")).startswith("failed") for r in info["rows"]):
            info["status"] = "failed: " + "; ".join(r["name"] + ": " + r["status"] for r in info["rows"]
                                                     if str(r.get("status", "ok")).startswith("failed"))[:400]
        return info

    def result_path(self, section: str, task: Task) -> Path:
        return self.work / "results" / f"{section}-{task.name}{'-exp' if task.env else ''}.json"

    def write_ctx(self, task: Task, result_path: Path, seconds: float) -> Path:
        a = self.a
        ctx = {"device": a.device, "dry_run": a.dry_run, "smoke": a.smoke, "work": str(self.work),
               "seconds": seconds, "trl": a.trl == "on" or (a.trl == "auto" and not a.smoke),
               "earlier": {k: {"rows": v.get("rows", [])} for k, v in self.report["sections"].items()
                           if v.get("rows")}}
        ctx_path = result_path.with_suffix(".ctx.json")
        _atomic(ctx_path, json.dumps(ctx, default=str))
        return ctx_path

    def start_batch(self) -> None:
        """--dry-run: one child for the setup of every child task of the selected first-call sections (each
        with its own context and result file, as on the GPU: one torch import instead of six). It starts
        right after the wheels, beside the import probe and the test collection."""
        if self.batch is not None or self.batch_done is not None:
            return
        items = []
        for name in self.wanted:
            if name in LATER or name == "setup":
                continue
            for t in tasks_of(name, self.a):
                if t.kind == "child":
                    path = self.result_path(name, t)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.unlink(missing_ok=True)
                    items.append({"task": t.name, "env": t.env, "result": str(path),
                                  "ctx": str(self.write_ctx(t, path, self.end - time.monotonic() - RESERVE_S))})
        batch = self.work / "results" / "dry_run_batch.json"
        batch.parent.mkdir(parents=True, exist_ok=True)
        _atomic(batch, json.dumps(items))
        log = self.logs / "dry_run_batch.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.batch_t0 = time.monotonic()
        with open(log, "wb") as f:
            self.batch = subprocess.Popen(child_command("gpu_task", "--batch", batch), stdout=f,
                                          stderr=subprocess.STDOUT, cwd=REPO, env=self.env, start_new_session=True)
        _CURRENT.append(self.batch)

    def wait_batch(self) -> tuple[int | None, float]:
        """The dry run's batch child's (exit code or None when killed at the suite's limit, seconds)."""
        if self.batch_done is None:
            self.start_batch()
            proc = self.batch
            try:
                rc: int | None = proc.wait(timeout=max(self.end - time.monotonic() - RESERVE_S, 0.1))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                rc = None
            except BaseException:  # Stop (a signal): the child goes with the driver
                kill_group(proc)
                raise
            finally:
                if proc in _CURRENT:
                    _CURRENT.remove(proc)
            self.batch_done = (rc, time.monotonic() - self.batch_t0)
            self.copy_log("dry run: every task's setup", self.logs / "dry_run_batch.log")
        return self.batch_done

    def summary(self) -> str:
        lines = [f"{'section':14s} {'s':>6s}  status ({self.call})"]
        for name in SECTIONS:
            sec = self.report["sections"][name]
            if name in self.wanted:
                lines.append(f"{name:14s} {sec.get('seconds', 0):6.1f}  {str(sec.get('status'))[:200]}")
        return "\n".join(lines)


def _module_of(script: str) -> str:
    """``benchmarks/update/bf16_update.py`` -> ``benchmarks.update.bf16_update`` (run with -m from the root)."""
    return script.removesuffix(".py").replace("/", ".")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, no CUDA work: every section's setup, the install guards and the report (CI)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes for the later sections (with --device cpu)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / ".bench" / "gpu_suite"),
                   help="folder for gpu_suite.json, gpu_suite.md and gpu_suite_children.log (default: $OUT)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--second", action="store_true",
                       help=f"the second call: {', '.join(SECOND)} (the first call prints the exact command)")
    which.add_argument("--only", nargs="+", choices=SECTIONS, help="run these sections (setup always runs)")
    p.add_argument("--skip", nargs="+", choices=SECTIONS, default=[], help="leave these sections out")
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"seconds for the whole suite (default {FIRST_LIMIT_S:.0f}; --second {SECOND_LIMIT_S:.0f}; "
                        f"--dry-run, which sets up both calls, {FIRST_LIMIT_S + SECOND_LIMIT_S:.0f})")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's budget")
    p.add_argument("--wheels", help="folder of wheels to install offline first (default: .whl/ when present)")
    p.add_argument("--trl", choices=["auto", "on", "off"], default="auto",
                   help="run the TRL child (auto: yes unless --smoke)")
    p.add_argument("--work", default=str(REPO / ".bench" / "gpu_suite_work"), help="models, logs, children's results")
    a = p.parse_args(argv)
    if a.time_limit is None:
        a.time_limit = SECOND_LIMIT_S if a.second else FIRST_LIMIT_S + SECOND_LIMIT_S if a.dry_run and not a.only \
            else FIRST_LIMIT_S
    if a.dry_run and a.device == "cuda":
        a.device = "cpu"  # no CUDA work: the children plan for cuda but run nothing there
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    suite = Suite(a)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        (suite.out / "gpu_suite_children.log").unlink(missing_ok=True)
    except OSError:
        pass
    try:
        suite.run()
    except Stop as e:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a second signal must not cut the last report
            signal.signal(sig, signal.SIG_IGN)
        for proc in list(_CURRENT):
            kill_group(proc)
        suite.report["stopped"] = str(e)
    except BaseException as e:  # last resort: the report still lands
        suite.report["driver_error"] = f"{type(e).__name__}: {e}"
        suite.report["driver_traceback"] = traceback.format_exc()[-3000:]
    for name in suite.wanted:
        if suite.report["sections"][name]["status"] in ("pending", "running"):
            suite.report["sections"][name]["status"] = "not run: the suite stopped first"
    suite.write()
    print(suite.summary(), file=sys.stderr)
    print(f"wrote {suite.out / 'gpu_suite.json'} and {suite.out / 'gpu_suite.md'} in "
          f"{time.monotonic() - suite.t0:.0f} s", file=sys.stderr)
    if suite.report.get("next_call"):
        print(f"next: the second call ({', '.join(SECOND)}; its own {SECOND_LIMIT_S:.0f} s), at once while the machine "
              f"is warm:\n  {suite.report['next_call']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
