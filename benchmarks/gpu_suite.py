"""Every GPU figure of slimgrpo in one command: one JSON and one markdown report.

    python benchmarks/gpu_suite.py --out DIR [--wheels .whl] [--time-limit 540]    (one CUDA GPU)
    python benchmarks/gpu_suite.py --device cpu --smoke --out DIR                  (CI: tiny shapes, seconds)
    python benchmarks/gpu_suite.py --only vs_trl planner ...                       (some sections only)

Sections, in the order they run (each with its own time budget; a failure is recorded in the report
and the suite goes on; a section, or a run inside one, that would start after its budget is spent is
reported as "skipped: budget"):

  env               torch / CUDA / driver / GPU, library versions, wheels installed from --wheels
  cuda_tests        ``pytest -m cuda`` (tests that need a GPU; they skip elsewhere)
  loss              chunked LM-head log-probs vs the naive [N, V] logits: 4K tokens, 152K vocab, bf16
  update_only_long  the Unsloth long-context setting without decoding: llama-3.1-8b shape, LoRA,
                    8 completions x 20K tokens, update only (synthetic completions), plan vs peak
  quantized         QLoRA (4-bit NF4 base) and bitsandbytes 8-bit AdamW, one update each (bitsandbytes
                    importable), plan vs peak
  rollout           TorchRolloutEngine tokens/s vs Hugging Face generate
  planner           planner vs torch.cuda.max_memory_allocated over full steps (generate + update) for
                    qwen2.5-0.5b, llama-3.2-1b, qwen2.5-1.5b shapes (random init, bf16) at the Oxen
                    settings (4 generations, prompt 256, completion 786 pinned), full / LoRA,
                    gradient checkpointing off / on; slimgrpo's s/step
  vs_trl            TRL 1.16 GRPOTrainer on the same settings in a child process (peak CUDA memory and
                    s/step), next to slimgrpo's from the planner section; "not installed" without trl
  long_context      issue 29's rows, measured: Qwen3-8B QLoRA (random weights, 4-bit NF4), 2 rows of
                    prompt 256 + the completion lengths the trace says fit 24 GB (offloaded checkpoints,
                    8-bit AdamW) and 80 GB (the whole 131,072 window), tiled MLP, checkpointing, and the
                    whole window with offloaded checkpoints; plan vs peak.
                    Last, and past the default --time-limit: run it as its own call
                    (``--only long_context --time-limit 540``)

The report is rewritten after every section, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from _gpu_report import markdown  # noqa: E402

SECTIONS = ["env", "cuda_tests", "loss", "update_only_long", "quantized", "rollout", "planner", "vs_trl",
            "long_context"]
# Seconds per section on one H100 (sum 525 of the default 540 s limit).
BUDGETS = {"env": 5, "cuda_tests": 60, "loss": 20, "update_only_long": 100, "quantized": 35, "rollout": 40,
           "planner": 140, "vs_trl": 125, "long_context": 520}  # long_context: its own call (see above)


class Budget(Exception):
    """A run was stopped (or not started) because its time budget was spent."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise Budget inside the block after ``seconds`` (main thread, SIGALRM); a no-op for <= 0."""
    if seconds <= 0:
        raise Budget("no time left")

    def handler(signum, frame):
        raise Budget(f"stopped after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- settings


def settings(smoke: bool) -> dict[str, Any]:
    """Sizes of every section: the real ones, or tiny ones for --smoke."""
    if smoke:
        tiny = {"family": "qwen2", "hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2,
                "vocab": 512, "tie": True, "max_positions": 512}
        tiny_llama = {**tiny, "family": "llama", "tie": False}
        return {"shapes": {"tiny-qwen2": tiny}, "long_shape": tiny_llama, "G": 2, "P": 8, "L": 8,
                "trl_shapes": ["tiny-qwen2"], "loss": {"tokens": 96, "hidden": 32, "vocab": 1000},
                "rollout": {"shape": "tiny-qwen2", "rows": 2, "prompt": 8, "new_tokens": 8, "repeats": 1},
                "long": {"shape": "tiny-llama", "rows": 2, "P": 8, "L": 64, "micro": 1},
                "quant": {"shape": "tiny-qwen2", "rows": 2, "P": 8, "L": 16}, "steps_timed": 2,
                "long_ctx": {"shape": "tiny-llama", "P": 8,
                             "rows": [{"L": 48, "offload": True}, {"L": 64}, {"L": 64, "offload": True}]}}
    return {"shapes": {n: None for n in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")}, "G": 4, "P": 256,
            "L": 786, "trl_shapes": ["qwen2.5-0.5b", "llama-3.2-1b"],
            "loss": {"tokens": 4096, "hidden": 896, "vocab": 151_936},
            "rollout": {"shape": "qwen2.5-0.5b", "rows": 8, "prompt": 64, "new_tokens": 256, "repeats": 2},
            "long": {"shape": "llama-3.1-8b", "rows": 8, "P": 256, "L": 20_000, "micro": 1},
            "quant": {"shape": "qwen2.5-0.5b", "rows": 4, "P": 256, "L": 786}, "steps_timed": 2,
            # docs/benchmarks.md#anchors-simulated (session 12): by trace P 256 + T 71,934 fits 24 GB with the
            # checkpoints offloaded and 8-bit AdamW; the whole 131,072 window (P 256 + T 130,816) fits 80 GB as
            # is, and with the checkpoints offloaded
            "long_ctx": {"shape": "qwen3-8b", "P": 256,
                         "rows": [{"L": 71_934, "offload": True, "optimizer": "adamw_8bit"}, {"L": 130_816},
                                  {"L": 130_816, "offload": True}]}}


QWEN3_8B = {"family": "qwen3", "hidden": 4096, "intermediate": 12288, "layers": 36, "heads": 32, "kv_heads": 8,
            "vocab": 151_936, "tie": False, "max_positions": 131_072, "head_dim": 128}  # its public config.json


def shape_of(name: str, spec: dict | None):
    from slimgrpo.memory.shapes import ModelShape, load_shape

    return ModelShape(**spec) if spec else load_shape(name)


def shape_dict(shape) -> dict[str, Any]:
    return {"family": shape.family, "hidden": shape.hidden, "intermediate": shape.intermediate,
            "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads, "vocab": shape.vocab,
            "tie": shape.tie, "max_positions": shape.max_positions or 32_768}


# ----------------------------------------------------------------------------- sections


def sec_env(ctx: dict) -> dict:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "device": ctx["device"]}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_mib=round(p.total_memory / 2**20), sms=p.multi_processor_count)
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            info["driver"] = out.splitlines()[0] if out else None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    from common import _version

    for name in ("transformers", "peft", "accelerate", "trl", "datasets", "bitsandbytes", "pyarrow"):
        info[name] = _version(name)
    info["wheels_installed"] = ctx.get("wheels_installed", [])
    line = (f"torch {info['torch']}, CUDA {info['cuda']}, driver {info.get('driver')}, "
            f"GPU {info.get('gpu', 'none')} ({info.get('gpu_mib', '-')} MiB)")
    return {"rows": [info], "line": line}


def sec_cuda_tests(ctx: dict) -> dict:
    targets = ["tests/test_cuda.py", "tests/test_offload.py"] if ctx["smoke"] else ["tests"]
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", *targets]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=max(ctx["remaining"](), 1))
    except subprocess.TimeoutExpired as e:
        raise Budget(f"pytest stopped after {e.timeout:.0f} s") from None
    out = proc.stdout + proc.stderr
    counts = {k: 0 for k in ("passed", "failed", "skipped", "deselected", "error")}
    import re

    summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", ln)]
    for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", summary[-1] if summary else ""):
        counts[k.rstrip("s") if k.startswith("error") else k] += int(n)
    problems = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return {"rows": [{**counts, "returncode": proc.returncode, "problems": problems[:30]}],
            "tail": out[-4000:], "status": "ok" if proc.returncode in (0, 5) else "failed: see problems"}


def sec_loss(ctx: dict) -> dict:
    import torch

    from _gpu_parts import loss_vs_naive

    s = ctx["cfg"]["loss"]
    dtype = torch.bfloat16 if ctx["device"] == "cuda" else torch.float32
    with time_limit(ctx["remaining"]()):
        rows = loss_vs_naive(s["tokens"], s["hidden"], s["vocab"], ctx["dev"], dtype, repeats=3)
    return {"rows": rows}


def sec_update_only_long(ctx: dict) -> dict:
    from _gpu_parts import step_config, update_only

    s = ctx["cfg"]["long"]
    shape = shape_of(s["shape"], ctx["cfg"].get("long_shape"))
    dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
    rows = []
    for offload in (False, True):
        name = f"{s['shape']} LoRA ckpt{' +offload' if offload else ''} {s['rows']}x{s['L']}"
        ov = step_config(True, True, s["rows"], s["P"], s["L"], dtype, micro=s["micro"], offload=offload)
        rows.append(ctx["run"](name, lambda ov=ov: update_only(shape, ov, ctx["dev"], s["rows"], s["P"], s["L"])))
    return {"rows": rows}


def sec_quantized(ctx: dict) -> dict:
    if ctx["device"] != "cuda":
        return {"rows": [{"name": w, "status": "skipped: needs CUDA"} for w in ("qlora", "adamw_8bit")],
                "status": "skipped: needs CUDA"}
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return {"rows": [{"name": w, "status": "not installed (bitsandbytes)"} for w in ("qlora", "adamw_8bit")],
                "status": "not installed"}
    import torch

    from _gpu_parts import quantized_step
    from slimgrpo.train.synthetic import random_causal_lm

    s = ctx["cfg"]["quant"]
    shape = shape_of(s["shape"], ctx["cfg"]["shapes"].get(s["shape"]))
    folder = ctx["work"] / "qlora_model"

    def qlora():
        if not (folder / "config.json").is_file():
            random_causal_lm(shape, torch.bfloat16, ctx["dev"]).save_pretrained(str(folder))
        return quantized_step(shape, ctx["dev"], "qlora", s["rows"], s["P"], s["L"], folder)

    return {"rows": [ctx["run"]("qlora", qlora),
                     ctx["run"]("adamw_8bit", lambda: quantized_step(shape, ctx["dev"], "adamw_8bit", s["rows"],
                                                                     s["P"], s["L"], None))]}


def sec_rollout(ctx: dict) -> dict:
    import torch

    from _gpu_parts import rollout_vs_hf

    s = ctx["cfg"]["rollout"]
    shape = shape_of(s["shape"], ctx["cfg"]["shapes"].get(s["shape"]))
    dtype = torch.bfloat16 if ctx["device"] == "cuda" else torch.float32
    with time_limit(ctx["remaining"]()):
        rows = rollout_vs_hf(shape, ctx["dev"], dtype, s["rows"], s["prompt"], s["new_tokens"], s["repeats"])
    return {"rows": rows}


def sec_long_context(ctx: dict) -> dict:
    """QLoRA on CUDA with bitsandbytes (a random bf16 model saved once, loaded in 4-bit); elsewhere (the CPU
    smoke run) the same settings on a plain LoRA base."""
    import torch

    from _gpu_parts import long_context_step
    from slimgrpo.train.synthetic import random_causal_lm

    s = ctx["cfg"]["long_ctx"]
    spec = QWEN3_8B if s["shape"] == "qwen3-8b" else ctx["cfg"].get("long_shape")
    shape = shape_of(s["shape"], spec)
    quantized = ctx["device"] == "cuda"
    if quantized:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return {"rows": [], "status": "not installed (bitsandbytes)"}
    folder = ctx["work"] / "long_ctx_model"

    def make_model():
        if quantized and not (folder / "config.json").is_file():
            random_causal_lm(shape, torch.bfloat16, ctx["dev"]).save_pretrained(str(folder))
        return {}

    rows = [ctx["run"]("random base saved", make_model)]
    for r in s["rows"]:
        offload, optimizer = r.get("offload", False), r.get("optimizer", "adamw")
        extras = "".join(f" + {w}" for w, on in (("offload", offload), ("8-bit AdamW", optimizer == "adamw_8bit"))
                         if on)
        rows.append(ctx["run"](f"{s['shape']} {'QLoRA' if quantized else 'LoRA'} 2 x ({s['P']} + {r['L']:,}), "
                               f"tiled MLP{extras}",
                               lambda r=r, o=offload, opt=optimizer: long_context_step(
                                   shape, ctx["dev"], s["P"], r["L"], folder, quantized, offload=o, optimizer=opt)))
    return {"rows": rows}


def planner_runs(cfg: dict) -> list[tuple[str, bool, bool]]:
    """(shape, lora, checkpointing), most wanted first: the TRL-paired runs, then checkpointing, then 1.5B."""
    names = list(cfg["shapes"])
    paired = [(n, lora, False) for n in cfg["trl_shapes"] for lora in (False, True)]
    rest = [(n, lora, ck) for n in names for ck in (False, True) for lora in (False, True)]
    return paired + [r for r in rest if r not in paired]


def sec_planner(ctx: dict) -> dict:
    from _gpu_parts import full_steps, step_config

    c = ctx["cfg"]
    dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
    rows = []
    for name, lora, ck in planner_runs(c):
        shape = shape_of(name, c["shapes"][name])
        steps = c["steps_timed"] if (name in c["trl_shapes"] and not ck) else 1
        ov = step_config(lora, ck, c["G"], c["P"], c["L"], dtype)
        label = f"{name} {'LoRA' if lora else 'full'} ckpt {'on' if ck else 'off'}"
        row = ctx["run"](label, lambda: full_steps(shape, ov, ctx["dev"], steps))
        row.update(shape=name, lora=lora, checkpointing=ck)
        rows.append(row)
    ctx["planner_rows"] = rows
    return {"rows": rows}


def sec_vs_trl(ctx: dict) -> dict:
    from common import _version

    if _version("trl") is None:
        return {"rows": [], "status": "not installed (trl)"}
    if not ctx["trl"]:
        return {"rows": [], "status": "skipped: --trl off"}
    import vs_trl
    import common

    c = ctx["cfg"]
    slim = {(r.get("shape"), r.get("lora")): r for r in ctx.get("planner_rows", []) if not r.get("checkpointing")}
    prompts = write_prompts(ctx["work"] / "prompts.jsonl", 8)
    rows = []
    for name in c["trl_shapes"]:
        shape = shape_of(name, c["shapes"][name])
        dtype = "bfloat16" if ctx["device"] == "cuda" else "float32"
        for lora in (False, True):
            label = f"{name} {'LoRA' if lora else 'full'}"

            def one(shape=shape, lora=lora):
                folder = common.build_model_folder(shape_dict(shape), dtype=dtype, root=ctx["work"] / "models",
                                                   corpus=synthetic_corpus())
                s = vs_trl.Settings(workload="gpu-suite", model_path=str(folder), dtype=dtype, device=ctx["device"],
                                    prompts_path=str(prompts), num_generations=c["G"], completion_length=c["L"],
                                    max_prompt_length=c["P"], steps=c["steps_timed"], beta=0.0, lora=lora)
                r = vs_trl.run_one("trl", 1, s, ctx["work"] / "runs", common.MemoryCap(None), c["L"],
                                   timeout=max(ctx["remaining"]() - 5, 1))  # the child is killed first
                if not r.ok:
                    raise RuntimeError(r.outcome.error or "TRL run failed")
                return {"trl_peak_alloc_mib": r.peak_cuda_mib(), "trl_peak_reserved_mib": r.peak_cuda_reserved_mib(),
                        "trl_s_per_step": r.s_per_step(), "trl_steps": len(r.steps)}

            row = ctx["run"](label, one)
            mine = slim.get((name, lora), {})
            row.update(slim_peak_alloc_mib=mine.get("peak_alloc_mib"), slim_s_per_step=mine.get("s_per_step"))
            if row.get("trl_peak_alloc_mib") and row.get("slim_peak_alloc_mib"):
                row["vram_ratio"] = row["slim_peak_alloc_mib"] / row["trl_peak_alloc_mib"]
            if row.get("trl_s_per_step") and row.get("slim_s_per_step"):
                row["time_ratio"] = row["slim_s_per_step"] / row["trl_s_per_step"]
            rows.append(row)
    return {"rows": rows}


def synthetic_corpus() -> list[str]:
    """Text to train the benchmark tokenizer on (the GPU machine has no GSM8K copy)."""
    words = ["apple", "number", "plus", "minus", "times", "answer", "question", "total", "each", "more"]
    return [f"Question {i}: {words[i % 10]} {i} {words[(3 * i) % 10]} {i * 7 % 97} = {i * 13 % 89}. "
            f"The answer is {i % 41}." for i in range(2000)]


def write_prompts(path: Path, count: int) -> Path:
    """Prompts of about 200 tokens (the Oxen setting caps prompts at 256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = synthetic_corpus()
    rows = [{"prompt": " ".join(corpus[i * 20:(i + 1) * 20])[:700] + "\nAnswer:", "answer": "1"} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


RUNNERS: dict[str, Callable[[dict], dict]] = {
    "env": sec_env, "cuda_tests": sec_cuda_tests, "loss": sec_loss, "update_only_long": sec_update_only_long,
    "quantized": sec_quantized, "rollout": sec_rollout, "planner": sec_planner, "vs_trl": sec_vs_trl,
    "long_context": sec_long_context,
}

# ----------------------------------------------------------------------------- driver


def install_wheels(folder: Path) -> list[str]:
    """pip-install every wheel of ``folder`` offline into a private target and put it first on the path
    (of this process and of every child)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return []
    target = Path(os.environ.get("SLIMGRPO_WHEEL_TARGET", "/tmp/slimgrpo-wheels"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)], check=True)
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    return [w.name for w in wheels]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--smoke", action="store_true", help="tiny shapes: checks the plumbing in seconds")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / ".bench" / "gpu_suite"),
                   help="folder for gpu_suite.json and gpu_suite.md (default: $OUT, else .bench/gpu_suite)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections (env always runs)")
    p.add_argument("--skip", nargs="+", choices=SECTIONS, default=[], help="leave these sections out")
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds for the whole suite")
    p.add_argument("--budget-scale", type=float, default=1.0, help="multiply every section's budget")
    p.add_argument("--wheels", help="folder of wheels to install offline first (TRL and its missing deps)")
    p.add_argument("--trl", choices=["auto", "on", "off"], default="auto",
                   help="run the TRL child (auto: yes unless --smoke)")
    p.add_argument("--work", default=str(REPO / ".bench" / "gpu_suite_work"), help="model folders and run logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t0 = time.perf_counter()
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device; use --device cpu --smoke for the CPU smoke run", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ctx: dict[str, Any] = {"device": a.device, "dev": torch.device(a.device), "smoke": a.smoke,
                           "cfg": settings(a.smoke), "work": work, "trl": a.trl == "on" or (a.trl == "auto" and not a.smoke)}
    if a.wheels:
        ctx["wheels_installed"] = install_wheels(Path(a.wheels))
    report: dict[str, Any] = {"suite": "slimgrpo gpu_suite", "smoke": a.smoke, "device": a.device,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "time_limit_s": a.time_limit, "settings": ctx["cfg"], "sections": {}}
    wanted = [s for s in SECTIONS if (not a.only or s in a.only or s == "env") and s not in a.skip]
    for name in SECTIONS:
        if name not in wanted:
            report["sections"][name] = {"status": "skipped: not selected", "rows": [], "seconds": 0.0}
            continue
        start = time.perf_counter()
        budget = BUDGETS[name] * a.budget_scale if not a.smoke else 120.0
        left_total = a.time_limit - (start - t0)
        deadline = start + max(min(budget, left_total - 2), 0)
        ctx["remaining"] = lambda deadline=deadline: deadline - time.perf_counter()
        ctx["run"] = lambda label, fn, _ctx=ctx: run_guarded(label, fn, _ctx)
        print(f"[{time.perf_counter() - t0:6.0f} s] {name} (budget {deadline - start:.0f} s)", file=sys.stderr, flush=True)
        try:
            if deadline - start <= 0:
                raise Budget("suite time limit reached")
            result = RUNNERS[name](ctx)
            result.setdefault("status", "ok")
        except Budget as e:
            result = {"status": f"skipped: budget ({e})", "rows": []}
        except Exception as e:  # the suite goes on; the report names the failure
            result = {"status": f"failed: {type(e).__name__}: {e}"[:500], "rows": [],
                      "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        result["budget_s"] = round(deadline - start, 1)
        report["sections"][name] = result
        report["elapsed_s"] = round(time.perf_counter() - t0, 1)
        write_report(report, out)
    print(f"wrote {out / 'gpu_suite.json'} and {out / 'gpu_suite.md'} in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return 0


def run_guarded(label: str, fn: Callable[[], dict], ctx: dict) -> dict:
    """One measurement inside a section: its own time limit (what is left of the section's budget);
    a failure or an exhausted budget becomes the row's status."""
    from _gpu_parts import fresh_memory

    t = time.perf_counter()
    try:
        with time_limit(ctx["remaining"]()):
            row = {"name": label, **fn(), "status": "ok"}
    except Budget as e:
        row = {"name": label, "status": f"skipped: budget ({e})"}
    except Exception as e:
        row = {"name": label, "status": f"failed: {type(e).__name__}: {e}"[:400]}
        if "out of memory" in str(e).lower():
            row["status"] = "failed: CUDA out of memory"
    with contextlib.suppress(Exception):
        fresh_memory(ctx["dev"])
    row["seconds"] = round(time.perf_counter() - t, 1)
    print(f"    {label}: {row['status']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    return row


def write_report(report: dict, out: Path) -> None:
    (out / "gpu_suite.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "gpu_suite.md").write_text(markdown(report))


if __name__ == "__main__":
    sys.exit(main())
