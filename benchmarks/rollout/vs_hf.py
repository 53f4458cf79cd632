"""Rollout throughput: TorchRolloutEngine against Hugging Face ``generate``, and against the hardware.

    python -m benchmarks.rollout.vs_hf [--device cpu] [--threads 2] [--new-tokens 256]

For each workload the same random-init model decodes G completions of exactly L tokens for one prompt
(``min_new_tokens = max_new_tokens`` so both sides do the same work), with plain temperature-1 sampling:
HF ``generate(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=G)`` and
``TorchRolloutEngine.generate``. Runs alternate (HF, ours, HF, ours, ...) in one process so both see
the same machine load; the table reports the median of the repeats.

The hardware bound of one decode step is

    bytes touched (decoder weights + LM head + KV cache read) / measured memory bandwidth
  + matmul FLOPs / measured matmul FLOP rate

(bandwidth: a sum over a 1 GiB buffer; FLOP rate: a 2048^3 float32 matmul; both probed just before
and after each of our runs, median used), converted to tokens/s as G / (step time). Prefill is excluded from the bound (it is <1% of the work here) but included in
both measured times. The floor column is ``speed/floor.py``'s decode floor (per step the larger of weight + KV bytes / bandwidth
and FLOPs / large-GEMM rate, summed over the L steps; a roofline lower bound rather than the sum above).
This is a script that prints a table, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import slimgrpo  # noqa: F401  (before torch, as the slimgrpo command: sets the OpenMP wait policy)
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from benchmarks.speed import floor as floor_mod
from benchmarks.surface import SamplingParams, SamplingWorkspace, TorchRolloutEngine, sample_next

PAD_ID, EOS_ID = 151643, 151645  # Qwen2's; a smaller vocabulary's last two ids (special_ids)


def special_ids(vocab: int) -> tuple[int, int]:
    """(pad, eos) for a model of ``vocab`` tokens."""
    return min(PAD_ID, vocab - 2), min(EOS_ID, vocab - 1)


@dataclass(frozen=True)
class Workload:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int = 151936
    tie: bool = True


WORKLOADS = {
    # W-cpu's model (the same shape as benchmarks/harness/builders.py W_CPU_SHAPE).
    "w-cpu": Workload("w-cpu", hidden=128, intermediate=512, layers=2, heads=4, kv_heads=2),
    "deep": Workload("deep", hidden=512, intermediate=2048, layers=8, heads=8, kv_heads=2),
    # SmolLM2-135M's shape (random weights: the same work per token as the real model).
    "smollm2": Workload("smollm2", hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152),
}


def build_model(w: Workload, device: str, seed: int = 0) -> torch.nn.Module:
    pad, eos = special_ids(w.vocab)
    config = Qwen2Config(
        vocab_size=w.vocab, hidden_size=w.hidden, intermediate_size=w.intermediate,
        num_hidden_layers=w.layers, num_attention_heads=w.heads, num_key_value_heads=w.kv_heads,
        tie_word_embeddings=w.tie, max_position_embeddings=32768, pad_token_id=pad, eos_token_id=eos,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(device).eval()


# ----------------------------------------------------------------------------- the hardware bound


class HardwareProbe:
    """Measures the machine's memory-read bandwidth and matmul FLOP rate, again before every run.

    On a shared machine both change with the neighbours' load, so the bound uses the median of the
    probes taken next to our own runs rather than one number from the start.
    """

    def __init__(self, device: str, gib: float = 1.0, n: int = 2048) -> None:
        self.device = device
        self.buf = torch.ones(int(gib * 2**30) // 4, device=device)  # streamed by a sum
        self.a, self.b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        self.bandwidths: list[float] = []
        self.flop_rates: list[float] = []

    def _best(self, fn, tries: int = 3) -> float:
        best = float("inf")
        for _ in range(tries):
            _sync(self.device)
            t = time.perf_counter()
            fn()
            _sync(self.device)
            best = min(best, time.perf_counter() - t)
        return best

    def measure(self) -> None:
        self.bandwidths.append(self.buf.numel() * 4 / self._best(self.buf.sum))
        self.flop_rates.append(2 * self.a.shape[0] ** 3 / self._best(lambda: self.a @ self.b))

    def median(self) -> tuple[float, float]:
        """(bytes/s, FLOP/s) over the probes so far."""
        return statistics.median(self.bandwidths), statistics.median(self.flop_rates)


def step_cost(w: Workload, rows: int, context: float) -> tuple[float, float]:
    """(bytes, FLOPs) of one decode step for ``rows`` rows at mean context length ``context``."""
    head_dim = w.hidden // w.heads
    kv_dim = w.kv_heads * head_dim
    layer_params = (
        w.hidden * (w.hidden + 2 * kv_dim) + (w.hidden + 2 * kv_dim)  # q, k, v projections (+ bias)
        + w.hidden * w.hidden  # o projection
        + 3 * w.hidden * w.intermediate  # gate, up, down
        + 2 * w.hidden  # two RMSNorm weights
    )
    head_params = w.vocab * w.hidden
    kv_bytes = rows * w.layers * 2 * kv_dim * context * 4  # K and V read by attention
    weight_bytes = (w.layers * layer_params + head_params + w.hidden) * 4
    matmul_flops = 2 * rows * (w.layers * layer_params + head_params)
    attn_flops = 2 * 2 * rows * w.layers * w.heads * head_dim * context  # q.k and p.v
    return weight_bytes + kv_bytes, matmul_flops + attn_flops


# ----------------------------------------------------------------------------- the two generators


def run_hf(model, prompt: torch.Tensor, rows: int, L: int) -> float:
    t = time.perf_counter()
    out = model.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
        top_p=1.0, top_k=0, min_new_tokens=L, max_new_tokens=L, num_return_sequences=rows,
        pad_token_id=model.config.pad_token_id, eos_token_id=model.config.eos_token_id,
    )
    _sync(prompt.device.type)
    elapsed = time.perf_counter() - t
    assert out.shape == (rows, prompt.shape[1] + L), out.shape
    return elapsed


def run_ours(engine: TorchRolloutEngine, prompt: list[int], rows: int, L: int) -> float:
    params = SamplingParams(
        max_new_tokens=L, min_new_tokens=L, temperature=1.0, top_p=1.0, top_k=0,
        eos_token_ids=(engine.parts.config.eos_token_id,), pad_token_id=engine.parts.config.pad_token_id,
    )
    t = time.perf_counter()
    ro = engine.generate([prompt], rows, params)
    _sync(ro.completion_ids.device.type)
    elapsed = time.perf_counter() - t
    assert ro.completion_ids.shape == (rows, L) and bool(ro.completion_mask.all())
    return elapsed


def component_times(engine: TorchRolloutEngine, rows: int, device: str, iters: int = 20) -> dict[str, float]:
    """Median seconds of the big per-step pieces, each timed alone on the model's real shapes."""
    parts = engine.parts
    hidden = torch.randn(rows, parts.lm_head.in_features, device=device)
    params = SamplingParams(max_new_tokens=1, eos_token_ids=(parts.config.eos_token_id,),
                            pad_token_id=parts.config.pad_token_id)
    workspace = SamplingWorkspace()

    def median(fn) -> float:
        fn()
        times = []
        for _ in range(iters):
            _sync(device)
            t = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    with torch.no_grad():
        logits = parts.logits(hidden)
        out = {
            "head (module, as HF)": median(lambda: parts.lm_head(hidden)),
            "sample (softmax+multinomial, as HF)": median(lambda: torch.multinomial(logits.softmax(-1), 1)),
            "sample (ours)": median(lambda: sample_next(logits, params, workspace=workspace)),
        }
        with parts.packed_weights(rows, "head"):
            out["head (ours)"] = median(lambda: parts.logits(hidden))
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--workloads", default="w-cpu,deep", help=f"comma list of {sorted(WORKLOADS)}")
    ap.add_argument("--rows", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--new-tokens", type=int, default=256, help="completion length L (pinned)")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2, help="alternated runs of each generator")
    ap.add_argument("--skip-hf", action="store_true", help="time only TorchRolloutEngine")
    ap.add_argument("--breakdown", action="store_true", help="also time LM head and sampler alone")
    ap.add_argument("--pack", default="auto", choices=["auto", "head", "all", "none"],
                    help="TorchRolloutEngine(pack_weights=...): which weights to pack for oneDNN on CPU")
    ap.add_argument("--pin-malloc", action="store_true",
                    help="pin glibc's mmap threshold as `slimgrpo train` does (memory/malloc.py), so that the "
                         "engine's decode-loop heap setting applies as in training")
    args = ap.parse_args()
    if args.pin_malloc:
        from benchmarks.surface import pin_mmap_threshold

        print(f"glibc mmap threshold pinned: {pin_mmap_threshold()} bytes")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, L = args.rows, args.new_tokens

    print(f"device={args.device} threads={torch.get_num_threads()} rows={rows} new_tokens={L} "
          f"prompt={args.prompt_len} repeats={args.repeats} pack_weights={args.pack}\n")

    header = (f"{'workload':<8} {'HF tok/s':>9} {'ours tok/s':>10} {'speedup':>8} "
              f"{'bound tok/s':>11} {'of bound':>8} {'ms/step':>8} {'bound ms':>8} {'floor tok/s':>11} {'floor/ours':>10}")
    lines = []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        model = build_model(w, args.device)
        engine = TorchRolloutEngine(model, pack_weights=args.pack)
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(1000, min(100000, w.vocab - 2), (args.prompt_len,), generator=g).tolist()
        prompt_t = torch.tensor([prompt], device=args.device)
        with torch.no_grad():  # warm up both paths (allocator, oneDNN primitives)
            run_ours(engine, prompt, rows, 4)
            if not args.skip_hf:
                run_hf(model, prompt_t, rows, 4)
        hf_times, our_times = [], []
        probe = HardwareProbe(args.device)
        for _ in range(args.repeats):
            if not args.skip_hf:
                with torch.no_grad():
                    hf_times.append(run_hf(model, prompt_t, rows, L))
            probe.measure()
            our_times.append(run_ours(engine, prompt, rows, L))
            probe.measure()
        bandwidth, flop_rate = probe.median()
        del probe
        ours = rows * L / statistics.median(our_times)
        hf = rows * L / statistics.median(hf_times) if hf_times else float("nan")
        nbytes, flops = step_cost(w, rows, context=args.prompt_len + L / 2)
        bound_step = nbytes / bandwidth + flops / flop_rate
        bound = rows / bound_step
        shape = {"hidden": w.hidden, "intermediate": w.intermediate, "layers": w.layers, "heads": w.heads,
                 "kv_heads": w.kv_heads, "vocab": w.vocab}
        fl = floor_mod.decode_floor(floor_mod.Step(shape=shape, rows=rows, prompt_len=args.prompt_len,
                                                   completion_len=L), floor_mod.Machine())
        floor_tok = rows * L / fl["decode_s"]
        lines.append(
            f"{name:<8} {hf:>9.0f} {ours:>10.0f} {ours / hf:>7.1f}x {bound:>11.0f} {ours / bound:>7.0%} "
            f"{1e3 * rows / ours:>8.2f} {1e3 * bound_step:>8.2f} {floor_tok:>11.0f} {floor_tok / ours:>9.2f}x"
        )
        print(f"[{name}] hidden={w.hidden} layers={w.layers} vocab={w.vocab}: "
              f"step reads {nbytes / 2**20:.0f} MiB, {flops / 1e9:.2f} GFLOP; "
              f"HF runs {['%.2fs' % t for t in hf_times]}, ours {['%.2fs' % t for t in our_times]}")
        print(f"    machine next to our runs (median): memory read {bandwidth / 1e9:.1f} GB/s, "
              f"fp32 matmul {flop_rate / 1e9:.1f} GFLOP/s")
        if args.breakdown:
            pieces = component_times(engine, rows, args.device)
            print("    per-step pieces (ms): " + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in pieces.items()))
        del model, engine
    print()
    print(header)
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
