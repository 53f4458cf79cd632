"""Peak memory and time of the LM-head log-prob forward + backward: chunked vs full logits.

Each configuration runs in its own subprocess (``benchmarks.children.loss_head``).  On CPU the peak is the
child's ``ru_maxrss`` (read by the parent with ``os.wait4``, i.e. from outside the process); on CUDA it is the
child's ``torch.cuda.max_memory_allocated``.  From each peak the peak of a child that only builds the
inputs is subtracted, so the table shows what the loss itself adds (logit temporaries, saved
tensors and the gradients of hidden states and head).  Times are reported as the ratio
chunked / naive from the same invocation.

    python -m benchmarks.update.loss_head --repeats 2         # 8 rows x 512 / 2048 / 4096
    python -m benchmarks.update.loss_head --head frozen --lengths 512 --repeats 2   # LoRA
    python -m benchmarks.update.loss_head --device cuda --dtype bf16 --naive-max-gib 100

The chunked column runs the path the trainer uses: ``--path fused`` (default; log-probs and the
loss gradient in one pass, ``slimgrpo.loss.fused``, here with the loss ``sum(upstream * logp)``) or
``--path separate`` (``chunked_token_logprobs`` then backward).  The floor column is the time of the
unavoidable LM-head products (3 with a trainable head, 2 with a frozen one) at the chunk's shapes and
this machine's measured GEMM rates (``speed/floor.py``), and the last column measured / floor.

The naive path is skipped (and reported as such) when its estimated extra memory, three
``[tokens, vocab]`` float32 tensors (logits / log-softmax / gradient), exceeds ``--naive-max-gib``.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.harness.measure import peak_rss_of
from benchmarks.harness.processes import child_command, child_env

GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096],
                   help="completion lengths (tokens per row)")
    p.add_argument("--rows", type=int, default=8, help="completions per loss call")
    p.add_argument("--hidden", type=int, default=896, help="hidden size (Qwen2.5-0.5B: 896)")
    p.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen2: 151,936)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--head", default="trainable", choices=["trainable", "frozen"],
                   help="frozen: the head gets no gradient (LoRA fine-tuning)")
    p.add_argument("--token-chunk", type=int, default=None,
                   help="tokens per chunk (default: the library's auto_token_chunk)")
    p.add_argument("--vocab-chunk", type=int, default=None, help="vocabulary rows per chunk")
    p.add_argument("--entropy", action="store_true",
                   help="also compute the entropy (as the trainer does, for logging)")
    p.add_argument("--naive-max-gib", type=float, default=12.0,
                   help="skip the naive path when its estimated extra memory exceeds this")
    p.add_argument("--repeats", type=int, default=1,
                   help="alternating chunked/naive runs per length; the best time is reported")
    p.add_argument("--path", default="fused", choices=["fused", "separate"],
                   help="chunked path: fused log-prob + loss (the trainer's default) or log-probs then backward")
    # one measurement (the child's): what it runs, at which length
    p.add_argument("--mode", choices=["inputs", "chunked", "naive"], help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- parent: orchestration ----------------------------------------------------------------------


def _measure(args: argparse.Namespace, mode: str, length: int) -> dict:
    """Runs one child; returns its report plus ``peak`` bytes (maxrss on CPU)."""
    cmd = child_command("loss_head", "--mode", mode, "--length", length)
    for flag in ("rows", "hidden", "vocab", "device", "dtype", "head", "token_chunk",
                 "vocab_chunk", "path"):
        value = getattr(args, flag)
        if value is not None:
            cmd += ["--" + flag.replace("_", "-"), str(value)]
    if args.entropy:
        cmd.append("--entropy")
    # the report is the child's last line; its peak RSS is its own (reaped with os.wait4)
    returncode, lines, maxrss = peak_rss_of(cmd, env=child_env())
    if returncode != 0:
        return {"error": f"failed (exit {returncode}: {lines[-1][:80]})"}
    report = json.loads(lines[-1])
    report["peak"] = report["cuda_peak"] if args.device == "cuda" else maxrss
    return report


def _naive_estimate(args: argparse.Namespace, length: int) -> int:
    """Extra bytes of the naive path: logits, log-softmax and a gradient, [tokens, vocab] fp32."""
    return 3 * args.rows * length * args.vocab * 4


def _fmt_gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from benchmarks.surface import auto_token_chunk

    chunk = args.token_chunk or f"{auto_token_chunk(args.vocab, args.vocab_chunk)} (auto)"
    print(f"# bench_loss: rows={args.rows} hidden={args.hidden} vocab={args.vocab} "
          f"dtype={args.dtype} device={args.device} head={args.head} "
          f"token_chunk={chunk} vocab_chunk={args.vocab_chunk} entropy={args.entropy} path={args.path}")
    print(f"# cpu count={os.cpu_count()} loadavg at start={os.getloadavg()}")
    header = ("| length | tokens | chunked extra GiB | naive extra GiB | memory naive/chunked "
              "| chunked s | naive s | time chunked/naive | floor s | chunked / floor |")
    print(header)
    print("|---" * 10 + "|")
    for length in args.lengths:
        base = _measure(args, "inputs", length)
        estimate = _naive_estimate(args, length)
        run_naive = estimate <= args.naive_max_gib * GIB
        chunked_runs, naive_runs = [], []
        for _ in range(args.repeats if run_naive else 1):  # alternate, so load drifts hit both
            chunked_runs.append(_measure(args, "chunked", length))
            if run_naive:
                naive_runs.append(_measure(args, "naive", length))
        chunked = _best(chunked_runs)
        naive = _best(naive_runs) if run_naive else {
            "skipped": f"not run (est. {estimate / GIB:.0f} GiB > --naive-max-gib)"}
        floor_s = _floor(args, args.rows * length)
        print(_row(length, args.rows * length, base, chunked, naive, floor_s), flush=True)
    print(f"# loadavg at end={os.getloadavg()}; times are the best of --repeats={args.repeats} "
          f"alternating runs where the naive path ran")


def _floor(args: argparse.Namespace, tokens: int) -> float | None:
    """Seconds of the unavoidable head products for ``tokens`` at the chunk's shapes (CPU fp32 only)."""
    if args.device != "cpu" or args.dtype != "fp32":
        return None
    from benchmarks.speed.floor import Machine
    from benchmarks.surface import auto_token_chunk

    machine = Machine()
    c = min(args.token_chunk or auto_token_chunk(args.vocab, args.vocab_chunk), tokens)
    shapes = [(c, args.hidden, args.vocab), (c, args.vocab, args.hidden)]
    if args.head == "trainable":
        shapes.append((args.vocab, c, args.hidden))
    return sum(tokens / c * 2.0 * m * k * n / machine.gemm(m, k, n) for m, k, n in shapes)


def _best(runs: list[dict]) -> dict:
    """Fastest run's time and the highest peak (the peak is deterministic up to noise)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    return {"seconds": min(r["seconds"] for r in ok), "peak": max(r["peak"] for r in ok)}


def _row(length: int, tokens: int, base: dict, chunked: dict, naive: dict, floor_s: float | None) -> str:
    def extra(r: dict) -> float | None:
        return None if "peak" not in r or "peak" not in base else r["peak"] - base["peak"]

    c_mem, n_mem = extra(chunked), extra(naive)
    c_s, n_s = chunked.get("seconds"), naive.get("seconds")
    mem_ratio = f"{n_mem / c_mem:.1f}x" if c_mem and n_mem else "-"
    time_ratio = f"{c_s / n_s:.2f}" if c_s and n_s else "-"
    naive_mem = naive.get("skipped") or naive.get("error") or _fmt_gib(n_mem)
    return (f"| {length} | {tokens} | {chunked.get('error') or _fmt_gib(c_mem)} | {naive_mem} "
            f"| {mem_ratio} | {c_s and f'{c_s:.1f}' or '-'} | {n_s and f'{n_s:.1f}' or '-'} "
            f"| {time_ratio} | {floor_s and f'{floor_s:.1f}' or '-'} "
            f"| {c_s and floor_s and f'{c_s / floor_s:.2f}' or '-'} |")


if __name__ == "__main__":
    main()
