"""A lower bound for one GRPO step on this machine: the work no implementation can skip, at this machine's rates.

    python -m benchmarks.speed.floor --workload w-cpu                 # W-cpu: floor of one step, by part
    python -m benchmarks.speed.floor --workload w-0.5b --lora         # qwen2.5-0.5b shape, LoRA
    python -m benchmarks.speed.floor --workload w-cpu --measured 7.75 # also print measured / floor

What is counted (everything else -- elementwise work, sampling, the optimizer, Python -- is left out,
so the floor is a bound, not an estimate):

* **update**: the matrix products through the LM head -- the reference pass (``beta > 0``) 1 per
  completion token, the policy 3 with a trainable head (logits, ``dL/dh``, ``dL/dW``) and 2 with a
  frozen one (LoRA) -- and through the decoder's linear layers over prompt + completion tokens
  (reference forward; policy forward, ``dL/dx`` and, for full fine-tuning, ``dL/dW``); attention
  scores and values (causal, half of ``L^2``).  A prompt is counted once per group of ``rows_per_prompt``
  completions (its completions differ only after it, so a trainer need not run it more than once).  Each product is timed on this machine as a GEMM of
  its own shape (``[m, k] x [k, n]``, fp32, best of a few), so the rate is the one the step can get.
* **decode**: each generated token reads every weight and the KV cache of its row once: per step
  ``max(bytes / bandwidth, FLOPs / large-GEMM rate)`` summed over the steps (a
  roofline bound; the prefill is left out).  Bandwidth: the best of a few sums over a 1 GiB buffer.

``floor_for`` is also imported by speed/vs_trl.py, update/loss_head.py and rollout/vs_hf.py for their floor
columns.
Rates are probed in this process: on a loaded machine the floor moves with the load, like the step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.harness.builders import W_CPU_SHAPE, load_shape


@dataclass(frozen=True)
class Step:
    """What one step does: the model's shape and the step's token counts."""

    shape: dict  # keys as in model_shapes.json (hidden, intermediate, layers, heads, kv_heads, vocab)
    rows: int  # completions per step
    prompt_len: int  # prompt tokens per row
    completion_len: int  # completion tokens per row
    token_chunk: int = 64  # tokens per LM-head product (auto_token_chunk for 151,936: what a run uses)
    trainable_head: bool = True  # full fine-tuning trains the (tied) head; LoRA does not
    full_ft: bool = True  # weight gradients of the decoder's linear layers
    reference: bool = True  # beta > 0: one more forward of the whole model
    rows_per_prompt: int = 1  # completions per prompt (num_generations): the prompt is needed once per group

    @property
    def decoder_tokens(self) -> float:
        """Tokens the decoder must run in one pass over the batch: each prompt once, every completion."""
        return self.rows / self.rows_per_prompt * self.prompt_len + self.rows * self.completion_len


class Machine:
    """GEMM rates (cached per shape) and memory-read bandwidth, measured in this process."""

    def __init__(self, repeats: int = 3, max_seconds: float = 2.0) -> None:
        self.repeats, self.max_seconds = repeats, max_seconds
        self._rates: dict[tuple[int, int, int, int], float] = {}
        self._bandwidth: float | None = None

    def gemm(self, m: int, k: int, n: int, batch: int = 1) -> float:
        """FLOP/s of ``[m, k] @ [k, n]`` (``batch`` of them at once) in fp32.

        The best of at least ``repeats`` runs, and of as many as fit in 0.2 s for small shapes (a
        small product's time is dominated by waking the threads, which load makes noisy).
        """
        key = (batch, m, k, n)
        if key not in self._rates:
            a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
            out = torch.empty(batch, m, n)
            torch.bmm(a, b, out=out)  # warm-up
            best = float("inf")
            spent = time.perf_counter()
            runs = 0
            while runs < self.repeats or (time.perf_counter() - spent < 0.2 and runs < 200):
                t = time.perf_counter()
                torch.bmm(a, b, out=out)
                best = min(best, time.perf_counter() - t)
                runs += 1
                if time.perf_counter() - spent > self.max_seconds:
                    break
            self._rates[key] = 2.0 * batch * m * k * n / best
        return self._rates[key]

    def bandwidth(self) -> float:
        """Bytes/s read by a sum over a 1 GiB float32 buffer (best of ``repeats``)."""
        if self._bandwidth is None:
            buf = torch.ones(2**28)
            best = float("inf")
            for _ in range(self.repeats):
                t = time.perf_counter()
                buf.sum()
                best = min(best, time.perf_counter() - t)
            self._bandwidth = buf.numel() * 4 / best
        return self._bandwidth


def _linear_shapes(shape: dict) -> list[tuple[int, int]]:
    """(in, out) of the linear layers of one decoder layer (Llama / Qwen2 style)."""
    h, i = shape["hidden"], shape["intermediate"]
    kv = shape["kv_heads"] * (h // shape["heads"])
    return [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]


def _timed(machine: Machine, m: int, k: int, n: int, times: float = 1.0) -> float:
    """Seconds of ``times`` products ``[m, k] x [k, n]`` at this shape's measured rate."""
    if m <= 0 or k <= 0 or n <= 0 or times == 0:
        return 0.0
    return times * 2.0 * m * k * n / machine.gemm(m, k, n)


def update_floor(step: Step, machine: Machine) -> dict[str, float]:
    """Seconds of the update's unavoidable products, by part."""
    s, h, V = step.shape, step.shape["hidden"], step.shape["vocab"]
    n_comp = step.rows * step.completion_len  # tokens through the LM head
    n_all = round(step.decoder_tokens)  # tokens through the decoder
    c = min(step.token_chunk, n_comp)
    chunks = n_comp / c
    head_fwd = _timed(machine, c, h, V, chunks)  # logits of one chunk
    head_dh = _timed(machine, c, V, h, chunks)  # dL/dh = dL/da W
    head_dw = _timed(machine, V, c, h, chunks)  # dL/dW = dL/da^T h
    policy_head = head_fwd + head_dh + (head_dw if step.trainable_head else 0.0)
    ref_head = head_fwd if step.reference else 0.0
    fwd = dx = dw = 0.0
    for k_in, n_out in _linear_shapes(s):
        fwd += _timed(machine, n_all, k_in, n_out, s["layers"])
        dx += _timed(machine, n_all, n_out, k_in, s["layers"])
        if step.full_ft:
            dw += _timed(machine, n_out, n_all, k_in, s["layers"])
    P, T, L = step.prompt_len, step.completion_len, step.prompt_len + step.completion_len
    # scores and weighted values, causal: a prompt's tokens see the prompt once per group, a completion's
    # see the prompt and the completion before them; timed at the rate of batched [L, d] x [d, L] products
    d = h // s["heads"]
    pairs = step.rows / step.rows_per_prompt * P * P / 2 + step.rows * (P * T + T * T / 2)
    attn_one = 2 * s["layers"] * s["heads"] * 2.0 * pairs * d / machine.gemm(L, d, L, batch=step.rows * s["heads"])
    backbone_policy = fwd + dx + dw + 3 * attn_one  # backward: 2 products per forward product
    backbone_ref = (fwd + attn_one) if step.reference else 0.0
    return {"lm_head_policy_s": policy_head, "lm_head_reference_s": ref_head,
            "decoder_policy_s": backbone_policy, "decoder_reference_s": backbone_ref,
            "update_s": policy_head + ref_head + backbone_policy + backbone_ref}


def decode_floor(step: Step, machine: Machine, bytes_per_value: int = 4) -> dict[str, float]:
    """Seconds of decoding ``completion_len`` tokens for ``rows`` rows: weight + KV reads per step."""
    s, h, V = step.shape, step.shape["hidden"], step.shape["vocab"]
    kv_dim = s["kv_heads"] * (h // s["heads"])
    layer_params = sum(a * b for a, b in _linear_shapes(s))
    weights = (s["layers"] * layer_params + V * h) * bytes_per_value
    bw = machine.bandwidth()
    # Compute roof: the rate of a large product (the update's LM-head chunk); a decode step's thin
    # products run far below it, but that is the implementation's cost, not the floor.
    rate = machine.gemm(min(step.token_chunk, 256), h, V)
    total = mem = 0.0
    for t in range(step.completion_len):
        ctx = step.prompt_len + t
        kv = step.rows * s["layers"] * 2 * kv_dim * ctx * bytes_per_value
        flops = 2 * step.rows * (s["layers"] * layer_params + V * h) + 4 * step.rows * s["layers"] * h * ctx
        t_mem = (weights + kv) / bw
        mem += t_mem
        total += max(t_mem, flops / rate)
    return {"decode_s": total, "decode_memory_s": mem, "bandwidth_gbs": bw / 1e9}


def floor_for(step: Step, machine: Machine | None = None) -> dict[str, float]:
    """Update + decode floor of one step, with its parts and the rates used."""
    machine = machine or Machine()
    out = {**update_floor(step, machine), **decode_floor(step, machine)}
    out["step_s"] = out["update_s"] + out["decode_s"]
    c = min(step.token_chunk, step.rows * step.completion_len)
    out["head_gemm_gflops"] = machine.gemm(c, step.shape["hidden"], step.shape["vocab"]) / 1e9
    return out


def mean_prompt_tokens(model_path: str, prompts_path: str, count: int) -> int:
    """Mean token count of the first ``count`` prompts of a JSONL file (``prompt`` column; a list of
    messages goes through the tokenizer's chat template, as both trainers do)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    rows = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line.strip()][:count]

    def text(prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    lengths = [len(tok(text(r["prompt"]), add_special_tokens=False)["input_ids"]) for r in rows]
    return round(sum(lengths) / max(len(lengths), 1))


WORKLOADS = {
    # name: (shape, rows, completion length, LoRA)
    "w-cpu": (W_CPU_SHAPE, 8, 256, False),
    "w-0.5b": ("qwen2.5-0.5b", 4, 128, True),
}


def auto_chunk(vocab: int) -> int:
    """The token chunk a run uses for this vocabulary (loss.token_chunk=None: ``auto_token_chunk``)."""
    from benchmarks.surface import auto_token_chunk

    return auto_token_chunk(vocab)


def workload_step(name: str, prompt_len: int, lora: bool | None = None, beta: float = 0.04,
                  completion_len: int | None = None, rows: int | None = None, rows_per_prompt: int = 1) -> Step:
    shape, r, L, default_lora = WORKLOADS[name]
    shape = load_shape(shape) if isinstance(shape, str) else dict(shape)
    lora = default_lora if lora is None else lora
    return Step(shape=shape, rows=rows or r, prompt_len=prompt_len, completion_len=completion_len or L,
                token_chunk=auto_chunk(shape["vocab"]), trainable_head=not lora, full_ft=not lora,
                reference=beta > 0, rows_per_prompt=rows_per_prompt)


def format_floor(f: dict[str, float], measured: float | None = None) -> str:
    lines = ["| part | floor s |", "|---|---:|"]
    for key, label in (("lm_head_reference_s", "LM head, reference pass"), ("lm_head_policy_s", "LM head, policy"),
                       ("decoder_reference_s", "decoder, reference pass"), ("decoder_policy_s", "decoder, policy"),
                       ("update_s", "**update**"), ("decode_s", "**decode** (weights + KV reads)"),
                       ("step_s", "**step**")):
        lines.append(f"| {label} | {f[key]:.3f} |")
    if measured:
        lines.append(f"| measured step | {measured:.3f} (measured / floor {measured / f['step_s']:.2f}x) |")
    lines.append(f"\nrates: LM-head GEMM {f['head_gemm_gflops']:.1f} GFLOP/s, memory read {f['bandwidth_gbs']:.1f} GB/s, "
                 f"{torch.get_num_threads()} threads")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="w-cpu")
    p.add_argument("--prompt-len", type=int, default=80, help="prompt tokens per row (GSM8K questions: ~60-110)")
    p.add_argument("--completion-length", type=int)
    p.add_argument("--rows", type=int)
    p.add_argument("--rows-per-prompt", type=int, default=1,
                   help="completions per prompt: the prompt counts once per group (default 1: every row its own)")
    p.add_argument("--lora", action="store_true", default=None)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--threads", type=int)
    p.add_argument("--measured", type=float, help="a measured s/step to compare with")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    step = workload_step(a.workload, a.prompt_len, a.lora, a.beta, a.completion_length, a.rows, a.rows_per_prompt)
    print(f"# floor of {a.workload}: {step}")
    print(format_floor(floor_for(step), a.measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
