"""Shared prompts in the update: time and peak memory of one update, prompt shared per group vs not.

    python -m benchmarks.update.shared_prompt                          # 2K prompt, 8 x 256 completions
    python -m benchmarks.update.shared_prompt --prompt-len 256 --completion-len 64 --repeats 1   # smoke

One optimizer step's forward + backward (``update.accumulate_gradients``, the trainer's own function,
fused head + loss on) over one group: a ``--prompt-len`` prompt and ``--completions`` completions of
``--completion-len`` tokens, with ``memory.share_prompt_forward`` on and off.  Each measurement runs in
its own process (``benchmarks.children.shared_prompt``); peak memory is the child's ``ru_maxrss`` read from
outside (``os.wait4``) minus that of a child that only builds the model and the batch.  Runs alternate shared /
unshared.

The model is random-init, Llama-shaped (default: hidden 512, 8 layers, vocabulary 32,000, full
fine-tuning): the prompt costs decoder work, which sharing saves; LM-head work is per completion token
and the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.harness.measure import peak_rss_of
from benchmarks.harness.processes import child_command, child_env

GIB = 1024**3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--completions", type=int, default=8)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--mode", choices=["inputs", "shared", "unshared"], help=argparse.SUPPRESS)  # the child's
    return p.parse_args(argv)


def _measure(a: argparse.Namespace, mode: str) -> dict:
    cmd = child_command("shared_prompt", "--mode", mode)
    for flag in ("prompt_len", "completions", "completion_len", "hidden", "intermediate", "layers", "heads",
                 "kv_heads", "vocab", "threads"):
        value = getattr(a, flag)
        if value is not None:
            cmd += ["--" + flag.replace("_", "-"), str(value)]
    returncode, lines, maxrss = peak_rss_of(cmd, env=child_env())  # its own peak RSS, read by os.wait4
    if returncode != 0:
        return {"error": lines[-1][:120]}
    return {**json.loads(lines[-1]), "peak": maxrss}


def main(argv=None) -> int:
    a = parse_args(argv)
    print(f"# bench_shared_prompt: prompt {a.prompt_len}, {a.completions} x {a.completion_len} completion tokens; "
          f"Llama hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}; threads {a.threads or 'default'}; "
          f"loadavg {os.getloadavg()}")
    base = _measure(a, "inputs")
    runs = {"shared": [], "unshared": []}
    for _ in range(a.repeats):
        for mode in runs:
            r = _measure(a, mode)
            runs[mode].append(r)
            print(f"  {mode}: {r}", file=sys.stderr)
    best = {}
    for mode, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        best[mode] = ({"seconds": min(r["seconds"] for r in ok), "extra": max(r["peak"] for r in ok) - base["peak"]}
                      if ok and "peak" in base else {"error": rs[0].get("error", "failed")})
    print("| update | s (best) | extra peak GiB |")
    print("|---|---:|---:|")
    for mode in ("unshared", "shared"):
        b = best[mode]
        if "error" in b:
            print(f"| {mode} | {b['error']} | |")
        else:
            print(f"| {mode} | {b['seconds']:.2f} | {b['extra'] / GIB:.2f} |")
    s, u = best["shared"], best["unshared"]
    if "error" not in s and "error" not in u:
        print(f"| unshared / shared | {u['seconds'] / s['seconds']:.2f}x | {u['extra'] / max(s['extra'], 1):.2f}x |")
    print(f"# loadavg at end {os.getloadavg()}; best of {a.repeats} alternating runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
