"""Decode with and without CUDA graphs: tokens/s and greedy equality, base / LoRA / QLoRA.

    python -m benchmarks.rollout.decode_graphs --device {cpu,cuda} [--json PATH] [--tiny] [--reps N]

For each random Llama-shaped model (``tiny``, and ``small`` unless ``--tiny``) and each variant (the base
model; LoRA adapters on every projection with non-zero B; QLoRA: the same on a bitsandbytes 4-bit base, only
with CUDA and bitsandbytes), the same greedy rollout runs through two engines:

* ``eager``: ``TorchRolloutEngine`` as it decodes by default (the dynamic lean stepper, ``llama_stepper.py``);
* ``graphs``: the engine with a kept graph cache (``rollout/graph_cache.py``): on CUDA the static-cache step
  recorded as CUDA graphs; on CPU, where there are none, the same static-cache stepper run eagerly.

The tiny model runs in float32 (equality with little rounding noise), the small one in bfloat16 on CUDA
(the speed that matters; its greedy tokens can part where two logits are within bf16 rounding: ``rows_equal``
says how many rows stayed equal). EOS is on (ids picked from a free greedy run, so rows end at different steps and leave the batch). Both
engines are warmed by one call (graphs are recorded there), then ``--reps`` timed calls alternate between them;
the table gives the median tokens/s (completion tokens generated / wall time), whether every call's tokens
were equal, and the graphs recorded during the timed calls (0: all were reused). Writes ``--json PATH``
(``{"device", "rows": [...]}``) for the GPU suite's ``decode`` section; sized to finish well under 90 s on
one H100 (a row that would not end inside ``--budget-s``, default 45 s, judged by the longest row so far, is
reported as skipped). A timing needs a quiet machine; equality does not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import slimgrpo  # noqa: F401  (before torch, as the slimgrpo command: sets the OpenMP wait policy)
import torch

from benchmarks.surface import (GraphCache, ModelShape, SamplingParams, TorchRolloutEngine, cuda_graph_cache,
                                random_causal_lm)

PAD, EOS_FALLBACK = 0, 1


@dataclass(frozen=True)
class Workload:
    name: str
    shape: ModelShape
    prompts: int
    generations: int
    max_new: int
    dtype: torch.dtype = torch.float32


def workloads(device: str, tiny: bool) -> list[Workload]:
    small_vocab = 32000 if device == "cuda" else 4096
    out = [Workload("tiny", ModelShape(family="llama", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2,
                                       vocab=512, tie=False, max_positions=1024),
                    prompts=4 if device == "cpu" else 8, generations=2 if device == "cpu" else 4,
                    max_new=16 if device == "cpu" else 64)]
    if not tiny:
        out.append(Workload("small", ModelShape(family="llama", hidden=512, intermediate=1536, layers=8, heads=8,
                                                kv_heads=4, vocab=small_vocab, tie=False, max_positions=2048),
                            prompts=16 if device == "cuda" else 4, generations=4, max_new=96 if device == "cuda" else 32,
                            dtype=torch.bfloat16 if device == "cuda" else torch.float32))
    return out


def prompts_for(w: Workload) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(6, 40, (w.prompts,), generator=g).tolist()
    return [torch.randint(2, w.shape.vocab, (n,), generator=g).tolist() for n in lengths]


def make_model(w: Workload, variant: str, device: torch.device, dtype: torch.dtype):
    """The base model, or it with LoRA adapters (QLoRA: on a bitsandbytes 4-bit load of it); None when the
    variant cannot run here (the reason as the second value)."""
    if variant == "qlora":
        if device.type != "cuda":
            return None, "needs CUDA"
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            return None, "needs bitsandbytes"
        from benchmarks.surface import ModelConfig, load_model

        with tempfile.TemporaryDirectory() as folder:
            random_causal_lm(w.shape, dtype, "cpu", initializer_range=0.2).save_pretrained(folder)
            model = load_model(ModelConfig(path=folder, load_in_4bit=True), device, dtype)
    else:
        model = random_causal_lm(w.shape, dtype, device, initializer_range=0.2)
    if variant in ("lora", "qlora"):
        from benchmarks.surface import LoraConfig, apply_lora

        model = apply_lora(model, LoraConfig(r=16, alpha=32.0), quantized=variant == "qlora")
        torch.manual_seed(1)
        with torch.no_grad():  # peft starts B at zero; give the adapters an effect
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    return model.eval(), None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(engine, prompts, G, params, device):
    sync(device)
    t = time.perf_counter()
    ro = engine.generate(prompts, G, params)
    sync(device)
    seconds = time.perf_counter() - t
    return ro, int(ro.completion_lengths.sum()) / seconds


def run_row(w: Workload, variant: str, device: torch.device, reps: int) -> dict:
    dtype = w.dtype
    row = {"model": w.name, "variant": variant, "rows": w.prompts * w.generations, "max_new": w.max_new,
           "layers": w.shape.layers, "hidden": w.shape.hidden, "dtype": str(dtype).removeprefix("torch.")}
    model, why = make_model(w, variant, device, dtype)
    if model is None:
        row["status"] = f"skipped: {why}"
        return row
    prompts = prompts_for(w)
    eager = TorchRolloutEngine(model)
    free = eager.generate(prompts, 1, SamplingParams(max_new_tokens=w.max_new, temperature=0.0, eos_token_ids=(),
                                                     pad_token_id=PAD)).completion_ids
    # EOS ids that end rows at different steps: tokens a few rows write early, in the middle and late
    picks = [(0, w.max_new // 8), (1 % w.prompts, w.max_new // 3), (2 % w.prompts, (2 * w.max_new) // 3)]
    eos = tuple(sorted({int(free[r, c]) for r, c in picks})) or (EOS_FALLBACK,)
    params = SamplingParams(max_new_tokens=w.max_new, temperature=0.0, eos_token_ids=eos, pad_token_id=PAD)
    # No per-call weight packing (CPU only anyway): both engines run the same products.
    eager.pack_weights = "none"
    graphed = TorchRolloutEngine(model, pack_weights="none")
    graphed.graph_cache = cuda_graph_cache(device) if device.type == "cuda" else GraphCache(exact=True)
    G = w.generations
    reference, _ = timed(eager, prompts, G, params, device)  # warm both (graphs are recorded here)
    first, _ = timed(graphed, prompts, G, params, device)
    cache = graphed.graph_cache
    captures_warm = cache.captures
    equal = torch.equal(reference.completion_ids, first.completion_ids)
    rows_equal = [bool(torch.equal(a, b)) for a, b in zip(reference.completion_ids, first.completion_ids)]
    speeds = {"eager": [], "graphs": []}
    for _ in range(reps):
        for name, engine in (("eager", eager), ("graphs", graphed)):
            ro, tok_s = timed(engine, prompts, G, params, device)
            speeds[name].append(tok_s)
            equal = equal and torch.equal(ro.completion_ids, reference.completion_ids)
    lengths = reference.completion_lengths.float()
    row.update({
        "status": "ok",
        "eos_ids": len(eos),
        "mean_length": round(float(lengths.mean()), 1),
        "ended_early": int((reference.completion_lengths < w.max_new).sum()),
        "eager_tok_s": round(statistics.median(speeds["eager"]), 1),
        "graphs_tok_s": round(statistics.median(speeds["graphs"]), 1),
        "greedy_equal": bool(equal),
        "rows_equal": f"{sum(rows_equal)}/{len(rows_equal)}",
        "captures_warm": captures_warm,
        "captures_timed": cache.captures - captures_warm,
        "graphs_kept": cache.graphs,
        "cache_mib": round(cache.nbytes() / 2**20, 2),
    })
    row["speedup"] = round(row["graphs_tok_s"] / row["eager_tok_s"], 3) if row["eager_tok_s"] else None
    if cache.failure:
        row["status"] = f"ok, graphs given up: {cache.failure}"[:200]
    del eager, graphed, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: list[dict]) -> str:
    cols = ["model", "variant", "dtype", "rows", "max_new", "mean_length", "eager_tok_s", "graphs_tok_s", "speedup",
            "greedy_equal", "rows_equal", "captures_warm", "captures_timed", "cache_mib", "status"]
    cells = [[str(r.get(c, "-")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(wd) for c, wd in zip(cols, widths))]
    lines += ["  ".join(x.ljust(wd) for x, wd in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--tiny", action="store_true", help="the tiny model only, at small sizes (the CPU test)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per engine (median)")
    ap.add_argument("--budget-s", type=float, default=45.0, help="skip the rows left once this much time has passed")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    start = time.perf_counter()
    rows = []
    longest = 0.0  # the longest row so far: a row that would not end inside --budget-s is not started
    for w in workloads(a.device, a.tiny):
        for variant in ("base", "lora", "qlora"):
            began = time.perf_counter()
            if began - start + longest > a.budget_s:
                rows.append({"model": w.name, "variant": variant,
                             "status": f"skipped: would pass --budget-s {a.budget_s:g}"})
                continue
            try:
                rows.append(run_row(w, variant, device, a.reps))
            except Exception as err:  # one failing variant must not cost the others their rows
                rows.append({"model": w.name, "variant": variant, "status": f"failed: {type(err).__name__}: {err}"[:300]})
            rows[-1]["row_s"] = round(time.perf_counter() - began, 1)
            if rows[-1].get("status", "").startswith("ok"):
                longest = max(longest, rows[-1]["row_s"] * (2.0 if w.name == "tiny" else 1.0))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    result = {"device": a.device, "torch": torch.__version__, "seconds": round(time.perf_counter() - start, 1),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "rows": rows}
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {a.json}")
    ok = all(r.get("status", "").startswith(("ok", "skipped")) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
