"""Shared pieces of the benchmarks: random-init model folders, prompt files, memory caps and
peak-memory measurement of a child process from outside.

Nothing here imports slimgrpo or TRL, so a benchmark can measure either one without loading it into
the harness's own process.

Run as a script, this file is also the small *intermediate* process that launches one measured run:

    python benchmarks/common.py measure --out rusage.json [--rlimit-as BYTES] [--cgroup DIR]
        [--poll-cap BYTES] -- python child.py ...

The intermediate is started fresh for every run, so ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` read
after the child exits is the peak RSS of that one run (not the maximum over earlier runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memcap import MemoryCap, choose_memory_cap, make_run_cgroup, read_cgroup, remove_cgroup  # noqa: E402,F401 (re-exported)

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / ".bench"  # gitignored: model folders, prompt files, run folders
# The shared data folder next to the checkout; SLIMGRPO_SHARED_DIR (or SLIMGRPO_SHARED) points elsewhere.
SHARED_DIR = Path(os.environ.get("SLIMGRPO_SHARED_DIR") or os.environ.get("SLIMGRPO_SHARED") or REPO_ROOT.parent / "shared")
GSM8K_DIR = SHARED_DIR / "data" / "gsm8k"
MODEL_SHAPES = SHARED_DIR / "data" / "model_shapes.json"

# Lines a child prints on stdout that start with this marker carry one JSON record for the harness.
RECORD_MARKER = "@@bench "

MIB = 1024 * 1024

# W-cpu's model: Qwen2-shaped, a real Qwen2.5 vocabulary size, tiny everything else.
W_CPU_SHAPE = {"family": "qwen2", "hidden": 128, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2,
               "vocab": 151936, "tie": True, "max_positions": 32768}

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


# ----------------------------------------------------------------------------- sizes


# ----------------------------------------------------------------------------- child records


def emit(record: dict) -> None:
    """One record of a benchmark child, parsed by run_measured in the parent."""
    print(RECORD_MARKER + json.dumps(record), flush=True)


def peak_cuda_mib() -> float | None:
    """Peak memory held by tensors (what the tables compare); None without CUDA."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def peak_cuda_reserved_mib() -> float | None:
    """Peak memory held by the caching allocator (closer to what nvidia-smi shows); None without CUDA."""
    import torch

    return torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else None


def save_plot(fig, png: Path) -> None:
    """Lay out and write a matplotlib figure (its folder made), and say where."""
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


def parse_size(text: str) -> int:
    """``"8GiB"`` -> bytes. Accepts B, KiB, MiB, GiB, TiB, their decimal forms (KB, GB...) and plain numbers."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"not a memory size: {text!r} (examples: 8GiB, 512MiB, 8000000000)")
    number, unit = float(m.group(1)), m.group(2).upper()
    powers = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}
    prefix = unit[:1] if unit[:1] in "KMGT" and unit else ""
    base = 1024 if "I" in unit or unit in ("K", "M", "G", "T") else 1000
    return int(number * base ** powers[prefix])


def format_mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


# ----------------------------------------------------------------------------- the machine


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, GPU and library versions, for the header of a results table."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "tokenizers", "slimgrpo"):
        info[name] = _version(name)
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- tokenizer and model


def build_tokenizer(out_dir: Path, vocab_size: int, corpus: list[str] | None = None) -> None:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` entries, saved as PreTrainedTokenizerFast.

    BPE is trained on GSM8K text up to 32K tokens; the rest of the vocabulary is filled with extra
    merges of existing tokens (ordinary BPE merges of low priority, like the long tail of a real
    tokenizer), so every id the model can sample decodes to text and nothing is an "added token".
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [EOS_TOKEN, PAD_TOKEN]
    corpus = corpus if corpus is not None else _gsm8k_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 32000), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges: list[list[str]] = spec["model"]["merges"]
    ordinary = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    need = vocab_size - len(vocab)
    if need > 0:
        for a in ordinary:
            for b in ordinary:
                if a + b not in vocab:
                    vocab[a + b] = len(vocab)
                    merges.append([a, b])
                    need -= 1
                    if need == 0:
                        break
            if need == 0:
                break
    tok = Tokenizer.from_str(json.dumps(spec))
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab_size}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   model_max_length=1 << 20)
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    # AutoTokenizer on a folder whose config.json says qwen2 would otherwise build a Qwen2 tokenizer class.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _gsm8k_text() -> list[str]:
    rows = [json.loads(line) for line in (GSM8K_DIR / "train.jsonl").read_text().splitlines() if line.strip()]
    return [r["question"] + "\n" + r["answer"] for r in rows]


def shape_key(shape: dict[str, Any], dtype: str) -> str:
    s = shape
    return (f"{s['family']}-v{s['vocab']}-h{s['hidden']}-i{s['intermediate']}-l{s['layers']}-a{s['heads']}"
            f"-kv{s['kv_heads']}-{'tie' if s['tie'] else 'untied'}-{dtype}")


def build_model_folder(shape: dict[str, Any], dtype: str = "float32", root: Path | None = None,
                       seed: int = 0, corpus: list[str] | None = None) -> Path:
    """A random-init causal LM of ``shape`` (keys as in model_shapes.json) plus a tokenizer of the same
    vocabulary size, saved with safetensors under ``root`` (default ``.bench/models``) and reused when
    it already exists. Returns the folder."""
    root = root or BENCH_DIR / "models"
    folder = root / shape_key(shape, dtype)
    if (folder / "model.safetensors.index.json").is_file() or (folder / "model.safetensors").is_file():
        if (folder / "tokenizer.json").is_file():
            return folder

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    build_tokenizer(tmp, shape["vocab"], corpus)  # corpus None: GSM8K text
    eos_id, pad_id = _special_ids(tmp)
    common = dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                  num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                  num_key_value_heads=shape["kv_heads"], tie_word_embeddings=shape["tie"],
                  max_position_embeddings=shape.get("max_positions", 32768), bos_token_id=eos_id,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    if shape["family"] == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif shape["family"] == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"unknown model family {shape['family']!r} (qwen2 or llama)")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # initialise directly in the target dtype (8B in fp32 would not fit)
    try:
        # Random init of a multi-billion-parameter model is much faster on a GPU when there is one.
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(str(tmp), safe_serialization=True)
    del model
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def _special_ids(folder: Path) -> tuple[int, int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    return tok.eos_token_id, tok.pad_token_id


def load_shape(name: str) -> dict[str, Any]:
    shapes = json.loads(MODEL_SHAPES.read_text())
    shapes.pop("_note", None)
    if name not in shapes:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(sorted(shapes))}")
    return shapes[name]


# ----------------------------------------------------------------------------- prompts and rewards


def _gsm8k_test(count: int) -> list[tuple[str, str]]:
    """``(question, final answer)`` of the first ``count`` GSM8K test rows."""
    out = []
    with open(GSM8K_DIR / "test.jsonl") as f:
        for line in f:
            if len(out) >= count:
                break
            r = json.loads(line)
            out.append((r["question"].strip(), r["answer"].split("####")[-1].strip()))
    return out


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_prompts(path: Path, count: int) -> Path:
    """The first ``count`` GSM8K test questions as a JSONL file with a ``prompt`` column (and ``answer``)."""
    return _write_jsonl(path, [{"prompt": q + "\nAnswer:", "answer": a} for q, a in _gsm8k_test(count)])


# The system prompt of the GRPO GSM8K recipes W-real follows (reasoning and answer tags).
REASONING_SYSTEM_PROMPT = ("Respond in the following format:\n<reasoning>\n...\n</reasoning>\n"
                           "<answer>\n...\n</answer>")


def write_chat_prompts(path: Path, count: int, system_prompt: str = REASONING_SYSTEM_PROMPT) -> Path:
    """The first ``count`` GSM8K test questions as conversational prompts (system + user messages)."""
    return _write_jsonl(path, [{"prompt": [{"role": "system", "content": system_prompt},
                                           {"role": "user", "content": q}], "answer": a}
                               for q, a in _gsm8k_test(count)])


# ----------------------------------------------------------------------------- one measured run


@dataclass
class RunOutcome:
    returncode: int
    wall_s: float
    peak_rss_mib: float | None
    records: list[dict[str, Any]] = field(default_factory=list)
    cgroup: dict[str, Any] = field(default_factory=dict)
    killed_by_cap: bool = False
    log_path: str = ""
    error: str = ""


_OOM_PATTERNS = re.compile(
    r"out of memory|cannot allocate memory|MemoryError|can't allocate memory|std::bad_alloc|"
    r"DefaultCPUAllocator|killed by the benchmark's memory cap",
    re.IGNORECASE,
)


def run_measured(cmd: list[str], log_path: Path, cap: MemoryCap, run_name: str, env: dict[str, str] | None = None,
                 timeout_s: float | None = None, echo=None) -> RunOutcome:
    """Run ``cmd`` under a fresh intermediate process that applies ``cap`` and reports the child's peak
    RSS. Child stdout lines starting with RECORD_MARKER are parsed as JSON records; every line goes to
    ``log_path``; ``echo(record)`` is called for each record as it arrives."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rusage_path = log_path.with_suffix(".rusage.json")
    rusage_path.unlink(missing_ok=True)
    cgroup = make_run_cgroup(cap, run_name)
    wrapper = [sys.executable, str(Path(__file__).resolve()), "measure", "--out", str(rusage_path)]
    if cgroup is not None:
        wrapper += ["--cgroup", str(cgroup)]
    elif cap.mechanism == "rlimit-as":
        wrapper += ["--rlimit-as", str(cap.bytes)]
    elif cap.mechanism == "poll-rss":
        wrapper += ["--poll-cap", str(cap.bytes)]
    wrapper += ["--", *cmd]

    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    timed_out = threading.Event()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(wrapper, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, cwd=str(REPO_ROOT), start_new_session=True)
        assert proc.stdout is not None

        def kill_on_timeout() -> None:  # the whole session: intermediate, child and its children
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        watchdog = threading.Timer(timeout_s, kill_on_timeout) if timeout_s else None
        if watchdog:
            watchdog.daemon = True
            watchdog.start()
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if line.startswith(RECORD_MARKER):
                try:
                    rec = json.loads(line[len(RECORD_MARKER):])
                except json.JSONDecodeError:
                    continue
                records.append(rec)
                if echo:
                    echo(rec)
        rc = proc.wait()
        if watchdog:
            watchdog.cancel()
    wall = time.perf_counter() - t0

    usage: dict[str, Any] = {}
    if rusage_path.is_file():
        usage = json.loads(rusage_path.read_text())
        rc = usage.get("returncode", rc)
    cg = read_cgroup(cgroup) if cgroup is not None else {}
    remove_cgroup(cgroup)
    tail = _tail(log_path)
    killed = bool(usage.get("killed_by_poll")) or bool(cg.get("oom_kills")) or (
        rc != 0 and cap.bytes is not None and (rc in (-9, 137) or bool(_OOM_PATTERNS.search(tail))))
    error = ""
    if timed_out.is_set():
        killed = False
        error = f"timed out after {timeout_s:.0f} s"
    elif rc != 0:
        error = "killed by the memory cap" if killed else _last_error_line(tail) or f"exit code {rc}"
    return RunOutcome(rc, wall, usage.get("maxrss_kib", 0) / 1024 if usage else None, records, cg, killed,
                      str(log_path), error)


def _tail(path: Path, chars: int = 20000) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - chars))
        return f.read().decode("utf-8", "replace")


def _last_error_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith(RECORD_MARKER)]
    for line in reversed(lines):
        if re.match(r"^\w*(Error|Exception)\b|^\w+\.\w+Error|^[A-Za-z_.]+Error:", line.strip()):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


# ----------------------------------------------------------------------------- competing load


def start_competitors(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes (a Python busy loop each): a reproducible "busy machine"."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(n)]


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- the intermediate process


def _tree_rss_bytes(root_pid: int) -> int:
    """RSS of a process and all its descendants, from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            parent[int(d.name)] = int(fields[1])
            rss[int(d.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(c for c, pp in parent.items() if pp == pid)
    return total


def _measure_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="common.py measure")
    p.add_argument("--out", required=True)
    p.add_argument("--cgroup")
    p.add_argument("--rlimit-as", type=int)
    p.add_argument("--poll-cap", type=int)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd

    def preexec() -> None:
        if a.cgroup:  # only the child (and what it starts) joins the capped cgroup, not this process
            procs = Path(a.cgroup) / "cgroup.procs"
            procs.write_text(str(os.getpid()))
        if a.rlimit_as:
            resource.setrlimit(resource.RLIMIT_AS, (a.rlimit_as, a.rlimit_as))

    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, preexec_fn=preexec)
    killed_by_poll = False
    if a.poll_cap:
        while child.poll() is None:
            if _tree_rss_bytes(child.pid) > a.poll_cap:
                print(f"killed by the benchmark's memory cap: RSS over {a.poll_cap / 2**30:.2f} GiB", flush=True)
                child.kill()
                killed_by_poll = True
                break
            time.sleep(0.1)
    try:
        rc = child.wait()
    except KeyboardInterrupt:
        child.kill()
        rc = child.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(a.out).write_text(json.dumps({
        "returncode": rc, "maxrss_kib": usage.ru_maxrss, "wall_s": time.perf_counter() - t0,
        "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "killed_by_poll": killed_by_poll,
    }))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        sys.exit(_measure_main(sys.argv[2:]))
    print(__doc__)
    sys.exit(2)
