"""slimgrpo against TRL's GRPOTrainer: same model folder, prompts, reward and settings.

    python -m benchmarks.speed.vs_trl --workload w-cpu [--steps 4] [--repeats 2] [--out results.json]
    python -m benchmarks.speed.vs_trl --workload w-long [--mem-cap 8GiB] [--max-length 16384] [--png PATH]
    python -m benchmarks.speed.vs_trl --workload w-gpu [--shape qwen2.5-0.5b] [--lora]   (GPU; untested)
    python -m benchmarks.speed.vs_trl --workload w-0.5b                                  (qwen2.5-0.5b shape, LoRA, CPU)
    python -m benchmarks.speed.vs_trl --workload w-real [--lora] [--model DIR]           (SmolLM2-135M-Instruct, CPU)
    python -m benchmarks.speed.vs_trl --workload demo
    python -m benchmarks.speed.vs_trl --workload w-cpu --quick                           (smoke test)

W-real is a real pretrained model: SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocabulary
49,152, tied head), set up once with ``python scripts/get_smollm2.py .bench/smollm2`` (the default
``--model``), on GSM8K test questions as chat prompts (a <reasoning>/<answer> system prompt), 2 prompts
x 8 completions of at most 128 tokens that stop at EOS (not pinned), beta 0.04, fp32.

Runs alternate between the trainers (trl, slimgrpo, trl, slimgrpo, ...), each in its own process
(``benchmarks.children.trl_grpo``, ``benchmarks.children.slimgrpo_grpo``) started through a fresh intermediate
process that reports the child's peak RSS (harness/measure.py). The completion
length is pinned (minimum = maximum new tokens) so both trainers generate and train on the same
number of tokens. Seconds per step is the median over the steps after the first (warm-up) step.

W-long: 1 prompt x 2 completions, completion length doubling from 512 (pinned), both trainers with
gradient checkpointing, 8 GiB cap per run, 2 steps per run (a warm-up, then one timed step). A trainer
stops at its first length that does not train; "did not fit" (cap / out of memory) and "too slow" (the
per-run --timeout, default 900 s) are reported apart. The table gives slimgrpo's plan next to its
measured peak, and a PNG plots peak RSS against length (w_long.py).

After the runs the harness measures this machine's floor for the workload (``floor.py``: the LM-head and
decoder products of the update and the weight + KV reads of decoding, at GEMM rates and bandwidth probed
in this process) and prints it next to each trainer's s/step; ``--no-floor`` skips it.

Numbers are only meaningful on a quiet machine: other processes competing for the cores change both
trainers' times, and not by the same factor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import processes
from benchmarks.harness.builders import W_CPU_SHAPE, build_model_folder, load_shape, write_chat_prompts, write_prompts
from benchmarks.harness.machine import machine_info, machine_line
from benchmarks.harness.measure import RunOutcome, run_measured
from benchmarks.harness.memcap import MemoryCap, choose_memory_cap, parse_size
from benchmarks.harness.paths import BENCH_DIR
from benchmarks.harness.rewards import DIGIT_REWARD
from benchmarks.harness.tables import format_mib
from benchmarks.speed import w_long

CHILDREN = {"trl": "trl_grpo", "slimgrpo": "slimgrpo_grpo"}  # benchmarks/children/NAME.py
REWARD = DIGIT_REWARD


# ----------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """Everything both trainers are given; written to each run's SPEC file."""

    workload: str
    model_path: str = ""
    dtype: str = "float32"
    device: str = "cpu"
    prompts_path: str = ""
    reward: str = REWARD
    num_generations: int = 8
    prompts_per_step: int = 1
    completion_length: int = 256
    pin_length: bool = True  # min new tokens = max new tokens: both trainers generate exactly L tokens
    conversational: bool = False  # prompts are message lists, rendered by the model's chat template
    max_prompt_length: int = 512
    steps: int = 4
    seed: int = 42
    learning_rate: float = 1e-6
    beta: float = 0.04
    epsilon: float = 0.2
    loss_type: str = "dapo"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    lora: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    gradient_checkpointing: bool = False
    num_threads: int | None = None
    shape: dict[str, Any] = field(default_factory=dict)

    def spec(self, trainer: str, output_dir: Path, completion_length: int | None = None) -> dict[str, Any]:
        d = asdict(self)
        d.pop("shape")
        d.update(trainer=trainer, output_dir=str(output_dir))
        if completion_length is not None:
            d["completion_length"] = completion_length
        return d


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["w-cpu", "w-long", "w-gpu", "w-0.5b", "w-real", "demo"], default="w-cpu")
    p.add_argument("--trainers", default="trl,slimgrpo", help="comma-separated, in the order they alternate")
    p.add_argument("--steps", type=int, help="optimizer steps per run (the first is a warm-up)")
    p.add_argument("--repeats", type=int, default=None, help="runs per trainer, alternating")
    p.add_argument("--completion-length", type=int, help="pinned completion length in tokens")
    p.add_argument("--no-pin", action="store_true",
                   help="let completions stop at EOS (the trainers then may not do the same work)")
    p.add_argument("--generations", type=int, help="completions per prompt")
    p.add_argument("--prompts-per-step", type=int)
    p.add_argument("--beta", type=float)
    p.add_argument("--lr", type=float)
    p.add_argument("--loss-type", choices=["grpo", "bnpo", "dr_grpo", "dapo"])
    p.add_argument("--device", help="cpu or cuda (default: the workload's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="w-gpu: a name from shared/data/model_shapes.json")
    p.add_argument("--model", help="w-real: the SmolLM2-135M-Instruct folder (default .bench/smollm2, made by "
                   "scripts/get_smollm2.py)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (r=16, alpha=32) instead of all weights")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--num-threads", type=int, help="torch CPU threads in both children (default: torch's)")
    p.add_argument("--mem-cap", default=None, help="memory cap per run, e.g. 8GiB (w-long default 8GiB; else none)")
    p.add_argument("--cap-mechanism", default="auto",
                   choices=["auto", "cgroup-v2", "cgroup-v1", "poll-rss", "rlimit-as"])
    p.add_argument("--max-length", type=int,
                   help="w-long: stop doubling at this length (default 32768; 64 with --quick)")
    p.add_argument("--timeout", type=float, help="seconds per run before it is killed")
    p.add_argument("--quick", action="store_true", help="tiny lengths and 2 steps: a smoke test of the harness")
    p.add_argument("--no-floor", action="store_true", help="do not measure the machine's floor for the workload")
    p.add_argument("--out", help="also write every record and the summary to this JSON file")
    p.add_argument("--png", help="w-long: where to write the peak-memory plot (default .bench/w_long.png)")
    return p.parse_args(argv)


def workload_settings(a: argparse.Namespace) -> Settings:
    w = a.workload
    s = Settings(workload=w)
    if w in ("w-cpu", "w-long"):
        s.shape = dict(W_CPU_SHAPE)
    elif w == "w-gpu":
        # Oxen.ai's TRL measurements: 4 generations, prompt <= 256, completion 786, bf16.
        s.shape = load_shape(a.shape)
        s.device, s.dtype = "cuda", "bfloat16"
        s.num_generations, s.completion_length, s.max_prompt_length = 4, 786, 256
    elif w == "w-0.5b":
        # A real shape on CPU: qwen2.5-0.5b, random init, LoRA, 4 completions x 128 tokens.
        s.shape = load_shape("qwen2.5-0.5b")
        s.num_generations, s.completion_length, s.lora, s.steps = 4, 128, True, 3
    elif w == "w-real":
        _real_settings(s, a.model)
    elif w == "demo":
        demo = _demo_settings(s)
        if demo is None:
            sys.exit("the demo workload needs slimgrpo.demo (MODEL_DIR, TRAIN_FILE, demo_config_dict), "
                     "which is not available in this checkout")
    if w == "w-long":
        # A memory-bound user's long-context run: few completions, checkpointing on (both trainers).
        s.steps, s.num_generations, s.prompts_per_step = 2, 2, 1
        s.completion_length, s.max_prompt_length, s.gradient_checkpointing = 512, 128, True
    if a.quick:
        s.steps = 2
        if w != "demo":
            s.completion_length = 16
    if a.no_pin:
        s.pin_length = False
    for flag, name in (("steps", "steps"), ("completion_length", "completion_length"),
                       ("generations", "num_generations"), ("prompts_per_step", "prompts_per_step"),
                       ("beta", "beta"), ("lr", "learning_rate"), ("loss_type", "loss_type"),
                       ("device", "device"), ("dtype", "dtype"), ("num_threads", "num_threads")):
        value = getattr(a, flag)
        if value is not None:
            setattr(s, name, value)
    s.lora = s.lora or a.lora
    s.gradient_checkpointing = s.gradient_checkpointing or a.gradient_checkpointing
    if s.steps < 2:
        print("note: with --steps 1 there is no step after the warm-up; s/step uses the first step", file=sys.stderr)
    return s


def _real_settings(s: Settings, model: str | None) -> None:
    """W-real: SmolLM2-135M-Instruct on GSM8K chat prompts, completions ending at EOS."""
    folder = Path(model or BENCH_DIR / "smollm2")
    if not (folder / "config.json").is_file():
        sys.exit(f"w-real needs SmolLM2-135M-Instruct in {folder}: run python scripts/get_smollm2.py {folder}")
    cfg = json.loads((folder / "config.json").read_text())
    s.model_path = str(folder)
    s.shape = {"family": cfg["model_type"], "hidden": cfg["hidden_size"], "intermediate": cfg["intermediate_size"],
               "layers": cfg["num_hidden_layers"], "heads": cfg["num_attention_heads"],
               "kv_heads": cfg["num_key_value_heads"], "vocab": cfg["vocab_size"],
               "tie": cfg.get("tie_word_embeddings", False), "max_positions": cfg["max_position_embeddings"]}
    s.num_generations, s.prompts_per_step, s.completion_length, s.steps = 8, 2, 128, 3
    s.pin_length, s.conversational = False, True


def _demo_settings(s: Settings) -> Settings | None:
    """The demo task of ``slimgrpo demo``: its tiny model, prompts, reward and settings."""
    try:
        from benchmarks.surface import DEMO_MODEL_DIR, DEMO_TRAIN_FILE, demo_config_dict
    except ImportError:
        return None
    if not (DEMO_MODEL_DIR / "config.json").is_file() or not DEMO_TRAIN_FILE.is_file():
        sys.exit(f"the demo assets are not built ({DEMO_MODEL_DIR}, {DEMO_TRAIN_FILE}): "
                 "run scripts/build_demo_model.py")
    d = demo_config_dict()
    s.model_path, s.prompts_path = str(DEMO_MODEL_DIR), str(DEMO_TRAIN_FILE)
    s.reward = "slimgrpo.demo.task:demo_accuracy"
    s.num_generations = d["num_generations"]
    s.prompts_per_step = d["prompts_per_step"]
    s.completion_length = d["max_completion_length"]
    # Demo prompts are a handful of characters; keep prompt + completion inside the model's context.
    max_positions = json.loads((DEMO_MODEL_DIR / "config.json").read_text()).get("max_position_embeddings", 128)
    s.max_prompt_length = min(64, max_positions - s.completion_length)
    s.beta = d.get("beta", 0.0)
    s.loss_type = d.get("loss_type", "dapo")
    s.learning_rate = d["learning_rate"]
    s.temperature = d["temperature"]
    s.steps = 20
    s.pin_length = False  # the demo task's answers end at EOS after 2-4 tokens; pinning would make it moot
    return s


# ----------------------------------------------------------------------------- running


@dataclass
class RunResult:
    trainer: str
    repeat: int
    completion_length: int
    outcome: RunOutcome

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.outcome.records if r.get("event") == "step"]

    @property
    def ok(self) -> bool:
        return self.outcome.returncode == 0

    def measured_steps(self) -> list[dict[str, Any]]:
        steps = self.steps
        return steps[1:] if len(steps) > 1 else steps

    def s_per_step(self) -> float | None:
        xs = [r["step_s"] for r in self.measured_steps() if r.get("step_s") is not None]
        return statistics.median(xs) if xs else None

    def gen_tokens_per_s(self) -> float | None:
        xs = [r["gen_tokens"] / r["gen_s"] for r in self.measured_steps() if r.get("gen_s") and r.get("gen_tokens")]
        return statistics.median(xs) if xs else None

    def gen_share(self) -> float | None:
        xs = [r["gen_s"] / r["step_s"] for r in self.measured_steps() if r.get("gen_s") and r.get("step_s")]
        return statistics.median(xs) if xs else None

    def peak_cuda_mib(self) -> float | None:
        xs = [r["peak_cuda_mib"] for r in self.outcome.records if r.get("peak_cuda_mib") is not None]
        return max(xs) if xs else None

    def peak_cuda_reserved_mib(self) -> float | None:
        xs = [r["peak_cuda_reserved_mib"] for r in self.outcome.records if r.get("peak_cuda_reserved_mib") is not None]
        return max(xs) if xs else None

    def mean_length(self) -> float | None:
        xs = [r["completion_mean_length"] for r in self.steps if r.get("completion_mean_length") is not None]
        return statistics.mean(xs) if xs else None

    def summary(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "repeat": self.repeat, "completion_length": self.completion_length,
                "ok": self.ok, "steps_done": len(self.steps), "s_per_step": self.s_per_step(),
                "gen_tokens_per_s": self.gen_tokens_per_s(), "gen_share": self.gen_share(),
                "peak_rss_mib": self.outcome.peak_rss_mib, "peak_cuda_mib": self.peak_cuda_mib(),
                "peak_cuda_reserved_mib": self.peak_cuda_reserved_mib(),
                "mean_completion_length": self.mean_length(), "error": self.outcome.error,
                "killed_by_cap": self.outcome.killed_by_cap, "wall_s": self.outcome.wall_s,
                "log": self.outcome.log_path, **self.outcome.cgroup}


def child_env() -> dict[str, str]:
    """A trainer child's environment (harness/processes.py), offline, no progress bars, output unbuffered."""
    return processes.child_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                               TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(BENCH_DIR / "hf_datasets"),
                               PYTHONUNBUFFERED="1", TQDM_DISABLE="1")


def run_one(trainer: str, repeat: int, s: Settings, run_root: Path, cap: MemoryCap,
            completion_length: int, timeout: float | None) -> RunResult:
    name = f"{trainer}-L{completion_length}-r{repeat}"
    run_dir = run_root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(s.spec(trainer, run_dir / "output", completion_length), indent=2))
    print(f"[{time.strftime('%H:%M:%S')}] {name}: starting (log: {run_dir / 'child.log'})", file=sys.stderr)

    def echo(rec: dict[str, Any]) -> None:
        if rec.get("event") == "step":
            gen = f", generate {rec['gen_s']:.2f} s" if rec.get("gen_s") else ""
            print(f"    step {rec['step']}: {rec['step_s']:.2f} s{gen}", file=sys.stderr)
        elif rec.get("event") == "setup":
            print(f"    setup {rec['setup_s']:.1f} s, {rec['threads']} threads, {rec['device']}, {rec['dtype']}",
                  file=sys.stderr)

    outcome = run_measured(processes.child_command(CHILDREN[trainer], spec_path), run_dir / "child.log",
                           cap, name, env=child_env(), timeout_s=timeout, echo=echo)
    result = RunResult(trainer, repeat, completion_length, outcome)
    status = "ok" if result.ok else f"FAILED: {outcome.error}"
    print(f"    {status}; peak RSS {format_mib(outcome.peak_rss_mib)} MiB, wall {outcome.wall_s:.0f} s",
          file=sys.stderr)
    return result


def prepare_inputs(s: Settings) -> None:
    if not s.model_path:
        t = time.perf_counter()
        s.model_path = str(build_model_folder(s.shape, dtype=s.dtype))
        print(f"model folder: {s.model_path} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    if not s.prompts_path:
        count = max(s.steps * s.prompts_per_step, 8)
        if s.conversational:
            s.prompts_path = str(write_chat_prompts(
                BENCH_DIR / "prompts" / f"gsm8k_test_chat_{count}.jsonl", count))
        else:
            s.prompts_path = str(write_prompts(
                BENCH_DIR / "prompts" / f"gsm8k_test_{count}.jsonl", count))


# ----------------------------------------------------------------------------- reporting


def _fmt(value: float | None, spec: str = "{:.2f}") -> str:
    return "-" if value is None else spec.format(value)


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparison_tables(results: list[RunResult], trainers: list[str], on_gpu: bool,
                      floor_s: float | None = None) -> tuple[str, dict[str, Any]]:
    mem_key, mem_name = ("peak_cuda_mib", "peak CUDA alloc MiB") if on_gpu else ("peak_rss_mib", "peak RSS MiB")
    lines = ["| run | steps | mean len | s/step | gen tok/s | gen share | peak RSS MiB | peak CUDA MiB | status |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.trainer} #{r.repeat} | {len(r.steps)} | {_fmt(r.mean_length(), '{:.0f}')} | "
                     f"{_fmt(r.s_per_step())} | "
                     f"{_fmt(r.gen_tokens_per_s(), '{:.1f}')} | {_fmt(r.gen_share(), '{:.0%}')} | "
                     f"{format_mib(r.outcome.peak_rss_mib)} | {format_mib(r.peak_cuda_mib())} | "
                     f"{'ok' if r.ok else r.outcome.error} |")
    agg: dict[str, dict[str, float | None]] = {}
    for t in trainers:
        rs = [r for r in results if r.trainer == t and r.steps]
        agg[t] = {"s_per_step": _median([r.s_per_step() for r in rs]),
                  "gen_tokens_per_s": _median([r.gen_tokens_per_s() for r in rs]),
                  "peak_mib": _median([r.summary()[mem_key] for r in rs]), "runs": len(rs)}
    lines += ["", f"| trainer | runs | s/step (median) | floor s/step | measured / floor | gen tok/s | {mem_name} |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for t in trainers:
        a = agg[t]
        a["over_floor"] = _ratio(a["s_per_step"], floor_s)
        lines.append(f"| {t} | {a['runs']} | {_fmt(a['s_per_step'])} | {_fmt(floor_s)} | "
                     f"{_fmt(a['over_floor'], '{:.2f}x')} | {_fmt(a['gen_tokens_per_s'], '{:.1f}')} | "
                     f"{format_mib(a['peak_mib'])} |")
    ratios = {}
    if "trl" in agg and "slimgrpo" in agg:
        s, t = agg["slimgrpo"], agg["trl"]
        ratios = {"s_per_step": _ratio(s["s_per_step"], t["s_per_step"]),
                  "gen_tokens_per_s": _ratio(s["gen_tokens_per_s"], t["gen_tokens_per_s"]),
                  "peak_mib": _ratio(s["peak_mib"], t["peak_mib"])}
        lines.append(f"| slimgrpo / trl | | {_fmt(ratios['s_per_step'], '{:.2f}x')} | | | "
                     f"{_fmt(ratios['gen_tokens_per_s'], '{:.2f}x')} | {_fmt(ratios['peak_mib'], '{:.2f}x')} |")
    return "\n".join(lines), {"per_trainer": agg, "ratios_slimgrpo_over_trl": ratios}


def machine_header(info: dict[str, Any], s: Settings, cap: MemoryCap) -> str:
    lines = [machine_line(info)
             + (f", GPU {info['gpu']}" if info.get("gpu") else "")
             + (f", load {info['load_avg_1m']} at start" if "load_avg_1m" in info else ""),
             "Versions: " + ", ".join(f"{k} {info[k]}" for k in ("torch", "transformers", "trl", "peft", "slimgrpo")
                                      if info.get(k)),
             f"Workload {s.workload}: model {Path(s.model_path).name}, {s.dtype} on {s.device}, "
             f"{s.prompts_per_step} prompt(s) x {s.num_generations} generations, completion "
             f"{'doubling from ' if s.workload == 'w-long' else ''}{s.completion_length} "
             f"({'pinned' if s.pin_length else 'at most; stops at EOS'}), "
             f"beta {s.beta}, lr {s.learning_rate}, loss {s.loss_type}, "
             f"{'LoRA r=%d' % s.lora_r if s.lora else 'full fine-tuning'}"
             f"{', gradient checkpointing' if s.gradient_checkpointing else ''}, {s.steps} steps per run "
             "(s/step: median after the first)",
             f"Memory cap per run: {cap.describe()}"]
    if info.get("load_avg_1m") is not None and info["cpu_cores"] and info["load_avg_1m"] > 0.5 * info["cpu_cores"]:
        lines.append("WARNING: the machine was busy when the benchmark started; time figures are indicative only.")
    return "\n".join(lines)


def machine_floor(s: Settings) -> dict[str, float] | None:
    """``floor.floor_for`` of this workload, its rates measured now in this process."""
    import torch

    from benchmarks.speed import floor as floor_mod

    if s.num_threads:
        torch.set_num_threads(s.num_threads)
    count = s.prompts_per_step * max(s.steps, 1)
    prompt_len = floor_mod.mean_prompt_tokens(s.model_path, s.prompts_path, count)
    step = floor_mod.Step(shape=s.shape, rows=s.prompts_per_step * s.num_generations, prompt_len=prompt_len,
                          completion_len=s.completion_length,
                          token_chunk=floor_mod.auto_chunk(s.shape["vocab"]), trainable_head=not s.lora,
                          full_ft=not s.lora, reference=s.beta > 0, rows_per_prompt=s.num_generations)
    print(f"measuring the floor ({step.rows} rows x {prompt_len} prompt + {step.completion_len} completion tokens)",
          file=sys.stderr)
    return floor_mod.floor_for(step)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    s = workload_settings(a)
    trainers = [t.strip() for t in a.trainers.split(",") if t.strip()]
    for t in trainers:
        if t not in CHILDREN:
            sys.exit(f"unknown trainer {t!r} (trl, slimgrpo)")
    mem_cap = a.mem_cap or ("8GiB" if s.workload == "w-long" else None)
    cap = choose_memory_cap(parse_size(mem_cap) if mem_cap else None, a.cap_mechanism)
    repeats = a.repeats or (1 if s.workload == "w-long" else 2)
    info = machine_info()
    prepare_inputs(s)
    run_root = BENCH_DIR / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{s.workload}"
    header = machine_header(info, s, cap)
    print(header, file=sys.stderr)

    results: list[RunResult] = []
    if s.workload == "w-long":
        lengths = []
        L = s.completion_length
        max_length = a.max_length or (64 if a.quick else 16384)
        if s.shape and s.shape.get("max_positions", 0) < s.max_prompt_length + max_length:
            sys.exit(f"--max-length {max_length} + prompt {s.max_prompt_length} exceeds the model's "
                     f"{s.shape['max_positions']:,} positions")
        timeout = a.timeout or (None if a.quick else 900)
        while L <= max_length:
            lengths.append(L)
            L *= 2
        alive = set(trainers)
        for L in lengths:
            for t in trainers:
                if t in alive:
                    r = run_one(t, 1, s, run_root, cap, L, timeout)
                    results.append(r)
                    print(f"    {t} at {L}: {w_long.status(r)}", file=sys.stderr)
                    if w_long.status(r) != "trained":
                        alive.discard(t)
            if not alive:
                break
        table, summary = w_long.table(results, trainers, s, cap)
        png = w_long.plot(summary, cap.bytes, Path(a.png or BENCH_DIR / "w_long.png"),
                          f"W-long: Qwen2 (V 151,936, H 128, 2 layers), {s.num_generations} completions, "
                          f"checkpointing, {s.dtype}")
        if png:
            print(f"plot: {png}", file=sys.stderr)
    else:
        for rep in range(1, repeats + 1):
            for t in trainers:
                results.append(run_one(t, rep, s, run_root, cap, s.completion_length, a.timeout))
        floor = None if a.no_floor or s.device != "cpu" else machine_floor(s)
        table, summary = comparison_tables(results, trainers, on_gpu=s.device.startswith("cuda"),
                                           floor_s=floor["step_s"] if floor else None)
        if floor:
            summary["floor"] = floor
            table += "\n\nFloor (benchmarks/speed/floor.py, measured after the runs): " + ", ".join(
                f"{k} {v:.3f}" for k, v in floor.items())

    print()
    print(header)
    print()
    print(table)
    failed = [r for r in results if not r.ok and s.workload != "w-long"]
    for r in failed:
        print(f"\n{r.trainer} #{r.repeat} failed: {r.outcome.error}\n  log: {r.outcome.log_path}")
    if a.out:
        payload = {"machine": info, "settings": asdict(s), "memory_cap": cap.describe(),
                   "runs": [{**r.summary(), "records": r.outcome.records} for r in results], "summary": summary}
        Path(a.out).write_text(json.dumps(payload, indent=2, default=str))
        print(f"\nwrote {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
