"""Shared prompts in the update: time and peak memory of one update, prompt shared per group vs not.

    python benchmarks/bench_shared_prompt.py                          # 2K prompt, 8 x 256 completions
    python benchmarks/bench_shared_prompt.py --prompt-len 256 --completion-len 64 --repeats 1   # smoke

One optimizer step's forward + backward (``update.accumulate_gradients``, the trainer's own function,
fused head + loss on) over one group: a ``--prompt-len`` prompt and ``--completions`` completions of
``--completion-len`` tokens, with ``memory.share_prompt_forward`` on and off.  Each measurement runs in
its own process; peak memory is the child's ``ru_maxrss`` read from outside (``os.wait4``) minus that of
a child that only builds the model and the batch.  Runs alternate shared / unshared.

The model is random-init, Llama-shaped (default: hidden 512, 8 layers, vocabulary 32,000, full
fine-tuning): the prompt costs decoder work, which sharing saves; LM-head work is per completion token
and the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1024**3


def _parse(argv=None) -> argparse.Namespace:
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
    p.add_argument("--child", choices=["inputs", "shared", "unshared"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _child(a: argparse.Namespace) -> None:
    import slimgrpo  # noqa: F401  (before torch: the OpenMP wait policy, as in training)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from slimgrpo.loss.objectives import LossSettings, Normaliser
    from slimgrpo.forward.layout import PromptSharing
    from slimgrpo.update import UpdateBatch, UpdateSettings
    from slimgrpo.update.gradients import accumulate_gradients

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=a.prompt_len + a.completion_len + 8, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(1)
    G, P, T = a.completions, a.prompt_len, a.completion_len
    prompt = torch.randint(0, a.vocab, (P,), generator=g)
    comp = torch.randint(0, a.vocab, (G, T), generator=g)
    ids = torch.cat([prompt.expand(G, P), comp], dim=1)
    am = torch.ones_like(ids)
    batch = UpdateBatch(ids, am, comp, am[:, P:].bool(), torch.randn(G, generator=g))
    seconds = 0.0
    if a.child != "inputs":
        norm = Normaliser.of(batch.loss_mask)
        t = time.perf_counter()
        sharing = PromptSharing.of(model) if a.child == "shared" else None  # the planner's verdict, read once
        accumulate_gradients(model, batch, UpdateSettings(LossSettings(), fuse=True, share_prompt=sharing), norm)
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds}))


def _measure(a: argparse.Namespace, mode: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode]
    for flag in ("prompt_len", "completions", "completion_len", "hidden", "intermediate", "layers", "heads",
                 "kv_heads", "vocab", "threads"):
        value = getattr(a, flag)
        if value is not None:
            cmd += ["--" + flag.replace("_", "-"), str(value)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.read().strip().splitlines() or ["<no output>"]
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return {"error": lines[-1][:120]}
    return {**json.loads(lines[-1]), "peak": usage.ru_maxrss * 1024}


def main(argv=None) -> int:
    a = _parse(argv)
    if a.child:
        _child(a)
        return 0
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
