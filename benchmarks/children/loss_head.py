"""One measurement of update/loss_head.py in a process of its own, so that its peak (``ru_maxrss``, read by the
parent with ``os.wait4``; on CUDA ``torch.cuda.max_memory_allocated``) is this measurement's alone.

    python -m benchmarks.children.loss_head --mode {inputs,chunked,naive} --length N [loss_head.py's flags]

``inputs`` only builds the hidden states, head and targets (the baseline the parent subtracts); ``chunked``
runs the path the trainer uses (``--path fused`` or ``separate``), ``naive`` the full ``[N, V]`` logits.
The last line printed is ``{"seconds": ..., "cuda_peak": ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.harness.from_tests import load_naive_token_logprobs
from benchmarks.update.loss_head import parse_args


def measure(args: argparse.Namespace) -> None:
    import slimgrpo  # noqa: F401  (before torch: the OpenMP wait policy, as in training)
    import torch

    from benchmarks.surface import HeadSpec, chunked_token_logprobs

    naive_token_logprobs = load_naive_token_logprobs()  # the full-logits baseline lives with the tests

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device)
    n_tokens = args.rows * args.length
    g = torch.Generator(device=device).manual_seed(0)

    def normal(*shape: int, std: float = 1.0) -> torch.Tensor:
        # Filled in place: a temporary here would raise the baseline peak and hide the
        # first ~GiB of what the loss adds.
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=g)

    hidden = normal(n_tokens, args.hidden).requires_grad_()
    weight = normal(args.vocab, args.hidden, std=args.hidden**-0.5)
    weight.requires_grad_(args.head == "trainable")
    targets = torch.randint(0, args.vocab, (n_tokens,), generator=g, device=device)
    upstream = torch.randn(n_tokens, generator=g, device=device)  # a generic gradient of log p
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds = 0.0
    if args.mode != "inputs":
        fn = chunked_token_logprobs if args.mode == "chunked" else naive_token_logprobs
        chunk = args.token_chunk  # None: the library's default (auto_token_chunk)
        start = time.perf_counter()
        if args.mode == "chunked" and args.path == "fused":
            from benchmarks.surface import fused_token_loss

            loss, _, _ = fused_token_loss(hidden, HeadSpec(weight), targets, lambda lp: (lp * upstream).sum(),
                                          token_chunk=chunk, return_entropy=args.entropy)
            loss.backward()
        else:
            logp, _ = fn(hidden, HeadSpec(weight), targets, token_chunk=chunk, vocab_chunk=args.vocab_chunk,
                         return_entropy=args.entropy)
            (logp * upstream).sum().backward()
        sync()
        seconds = time.perf_counter() - start
    cuda_peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    print(json.dumps({"seconds": seconds, "cuda_peak": cuda_peak}))


def main(argv: list[str] | None = None) -> int:
    measure(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
