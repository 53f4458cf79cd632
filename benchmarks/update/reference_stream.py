"""GPU check of issue 42 items 4 and 5: the full-fine-tuning reference run three ways, and the offload pool's
pinned bytes against the plan's host line. Random weights of a preset's shape, no download.

    python -m benchmarks.update.reference_stream --shape qwen2.5-1.5b --rows 8 --tokens 1024     # needs CUDA

Prints one JSON object: per placement (device, stream, host) the seconds of one reference forward (after a
warm-up), the peak device bytes it added, and whether its logits equal the device copy's (stream must be
bit-identical: the same kernels on the same weights); the stream row reads from the host copy's one buffer
pinned in place, as the trainer streams it (``pinned`` says whether the driver took the pin: false means the
copies were synchronous and the time is not the trainer's); then the plan's ``reference stream`` working set,
and for one checkpointed + offloaded update step the pool's pinned bytes against the plan's
``offloaded checkpoints`` line (its peaks started anew for that step, not carried from the rows before). A
timing, so run it on a quiet machine. ``--device cpu`` runs the same code on a CPU (a smoke test: every
placement is host memory there).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _timed_forward(model, ids, device) -> tuple[float, int, torch.Tensor]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        model(input_ids=ids)  # warm-up
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        t = time.perf_counter()
        out = model(input_ids=ids).logits
        sync()
        seconds = time.perf_counter() - t
        peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
    return seconds, peak, out.to(device)


def reference_placements(shape, device, rows: int, tokens: int) -> dict:
    from benchmarks.surface import StreamedReference, random_causal_lm, reference_copy

    policy = random_causal_lm(shape, torch.bfloat16 if device.type == "cuda" else torch.float32, device)
    ids = torch.randint(1, shape.vocab, (rows, tokens), device=device)
    out: dict = {}
    on_device = reference_copy(policy, device)
    seconds, peak, want = _timed_forward(on_device, ids, device)
    out["device"] = {"seconds": seconds, "peak_added_bytes": peak, "equal": True}
    del on_device
    host = reference_copy(policy, torch.device("cpu"))
    with StreamedReference(host, device, host=host.host_buffer) as streamed:  # pinned once, as the trainer does
        seconds, peak, got = _timed_forward(streamed, ids, device)
    out["stream"] = {"seconds": seconds, "peak_added_bytes": peak, "equal": bool(torch.equal(got, want)),
                     "pinned": bool(host.host_buffer.pinned)}
    seconds, _, got = _timed_forward(host, ids.cpu(), torch.device("cpu"))
    out["host"] = {"seconds": seconds, "max_abs_diff": float((got.to(device).float() - want.float()).abs().max())}
    host.host_buffer.unpin()  # before its memory goes back to the allocator
    return out


def offload_pool(shape, device, rows: int, tokens: int) -> dict:
    from benchmarks.surface import (RunSpec, UpdateOnly, activation_pool, plan_memory, random_causal_lm,
                                    registered_bytes, reset_pinned_peaks, synthetic_rollout, update_config)

    prompt, completion = tokens // 4, tokens - tokens // 4
    cfg = update_config({"memory": {"gradient_checkpointing": True, "offload_activations": True,
                                    "micro_batch_size": rows, "tiled_mlp": "off"}, "lora": {"enabled": True},
                         "rollout": {"num_generations": rows, "max_completion_length": completion},
                         "data": {"max_prompt_length": prompt}, "loss": {"beta": 0.0}})
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    runner = UpdateOnly(cfg, random_causal_lm(shape, dtype, device), device=device)
    pool = activation_pool(device)
    reset_pinned_peaks()  # this step's peaks, not the reference rows' before it
    if device.type == "cuda" and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
        torch.cuda.reset_peak_host_memory_stats()
    runner.step(synthetic_rollout(1, rows, prompt, completion, vocab=shape.vocab, device=device))
    plan = plan_memory(shape, RunSpec(
        device="cuda", lora=True, param_dtype_bytes=dtype.itemsize, num_generations=rows, prompts_per_step=1,
        micro_batch_rows=rows, max_prompt_length=prompt, max_completion_length=completion,
        gradient_checkpointing=True, offload_activations=True, beta=0.0, tiled_mlp="off"))
    stats = torch.cuda.host_memory_stats() if device.type == "cuda" else {}
    return {"pool_bytes_held": pool.peak_bytes_held, "pool_overflow_bytes": pool.overflow_bytes,
            "pinned_in_place_peak": registered_bytes()[1],
            "plan_host_line": plan.bytes_of("offloaded checkpoints"),
            "caching_host_allocator_peak": stats.get("allocated_bytes.peak", 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU (or --device cpu for a smoke test)")
        return 2
    from benchmarks.surface import RunSpec, load_shape, plan_memory

    shape = load_shape(args.shape)
    result = {"shape": args.shape, "rows": args.rows, "tokens": args.tokens,
              "placements": reference_placements(shape, device, args.rows, args.tokens)}
    plan = plan_memory(shape, RunSpec(device="cuda", beta=0.04, reference_placement="stream"))
    result["plan_stream_working_set"] = [c.formula for c in plan.components if c.name == "reference stream"]
    if device.type == "cuda":
        result["offload"] = offload_pool(shape, device, args.rows, args.tokens)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
