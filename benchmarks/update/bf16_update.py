"""How much of an optimizer step survives in bfloat16 weights: today's plain AdamW against slimgrpo's rules.

    python -m benchmarks.update.bf16_update --device cpu --steps 10 [--json PATH]
    python -m benchmarks.update.bf16_update --device cuda --steps 10 --json bf16_update.json   # the GPU suite's call

A random Llama-shaped model (SmolLM2-135M's widths, ``--layers`` decoder layers; transformers' init: weights
N(0, 0.02), norms 1) is copied into each variant with its weights rounded to bfloat16, so every variant starts
from the same values. Each takes ``--steps`` AdamW steps (betas 0.9 / 0.99, weight decay 0, as slimgrpo's
defaults) with the same gradients: per step, a fixed direction plus twice as much fresh noise (a GRPO gradient
is mostly noise from step to step), scaled to a global norm of 1 (``optim.max_grad_norm``'s clip), so only
the update rule differs. The variants, at learning rates 1e-6 and 1e-5:

- ``fp32``: the float32 reference, torch's AdamW on float32 copies;
- ``bf16 plain``: torch's AdamW on the bfloat16 weights (``memory.bf16_update=plain``; what slimgrpo did before);
- ``bf16 fp32_master``: slimgrpo's ``build_optimizer`` with ``memory.bf16_update=fp32_master`` (``auto`` with
  ``adamw``): float32 master copies;
- ``bf16 stochastic_round``: torchao's AdamW with stochastic rounding (``auto`` with ``adamw_8bit`` rounds the
  same way in 8-bit AdamW), where torchao is installed.

Per variant: the fraction of weight elements the forward sees changed from the start (``changed``); the
distance of those weights from the float32 reference's, relative to the reference's own update
(``rel_dist`` = |w - w_ref| / |w_ref - w0|: 0 = the reference's step exactly, 1 = as far as not moving at
all); the cosine between their update and the reference's (``cos``); and for ``fp32_master`` the same two
for the master copy the optimizer steps (``master_rel_dist``, ``master_cos``). Norm weights (ones) count
with the rest. torchao compiles its step on first use (seconds per tensor shape, not counted).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

LRS = (1e-6, 1e-5)
RULES = ("plain", "fp32_master", "stochastic_round")


def llama_weights(layers: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random Llama (SmolLM2-135M's widths, ``layers`` layers), its parameters as float32 tensors by name."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         initializer_range=0.02)
    model = LlamaForCausalLM(config)
    return {name: p.detach().float().clone() for name, p in model.named_parameters()}


def gradients(shapes: dict[str, torch.Size], steps: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``steps`` gradients: a fixed direction plus twice its size of fresh noise, global norm 1 each."""
    gen = torch.Generator().manual_seed(seed)
    signal = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    out = []
    for _ in range(steps):
        g = {n: signal[n] + 2.0 * torch.randn(s, generator=gen) for n, s in shapes.items()}
        norm = torch.sqrt(sum((t * t).sum() for t in g.values()))
        out.append({n: t / norm for n, t in g.items()})
    return out


def _optimizer(rule: str | None, params: list[torch.nn.Parameter], lr: float, device: torch.device):
    """The optimizer a variant runs: torch's AdamW for the reference and ``plain``; slimgrpo's
    build_optimizer for its rules (the code a run uses)."""
    if rule in (None, "plain"):
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    from benchmarks.surface import Config, build_optimizer

    cfg = Config()
    cfg.optim.learning_rate, cfg.optim.adam_beta1, cfg.optim.adam_beta2 = lr, 0.9, 0.99
    cfg.optim.weight_decay = 0.0
    cfg.memory.optimizer, cfg.memory.bf16_update = "adamw", rule
    return build_optimizer(params, cfg, device)


def run_variant(start: dict[str, torch.Tensor], grads: list[dict[str, torch.Tensor]], lr: float, rule: str | None,
                device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(weights after the steps as float32, the master copies or None). ``rule`` None = the fp32 reference."""
    dtype = torch.float32 if rule is None else torch.bfloat16
    params = {n: torch.nn.Parameter(t.to(device=device, dtype=dtype, copy=True)) for n, t in start.items()}
    opt = _optimizer(rule, list(params.values()), lr, device)
    for g in grads:
        for n, p in params.items():
            p.grad = g[n].to(device=device, dtype=dtype)
        opt.step()
    weights = {n: p.detach().float().cpu() for n, p in params.items()}
    masters = None
    if rule == "fp32_master":
        masters = {n: opt.state[p]["master"].detach().float().cpu() for n, p in params.items()}
    return weights, masters


def compare(start: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict:
    """changed (fraction of elements moved from ``start``), rel_dist and cos against the reference's update."""
    moved = total = 0
    diff2 = ref2 = dot = got2 = 0.0
    for n, w0 in start.items():
        d_ref, d_got = ref[n] - w0, got[n] - w0
        moved += int((got[n] != w0).sum())
        total += w0.numel()
        diff2 += float(((got[n] - ref[n]).double() ** 2).sum())
        ref2 += float((d_ref.double() ** 2).sum())
        got2 += float((d_got.double() ** 2).sum())
        dot += float((d_ref.double() * d_got.double()).sum())
    return {"changed": moved / total, "rel_dist": (diff2 / ref2) ** 0.5,
            "cos": dot / ((ref2 * got2) ** 0.5) if got2 > 0 else 0.0}


def measure(start: dict[str, torch.Tensor], grads: list[dict[str, torch.Tensor]], lrs=LRS, rules=RULES,
            device: torch.device = torch.device("cpu")) -> list[dict]:
    """One row per (learning rate, variant): the figures of ``compare`` (plus the master copy's for
    ``fp32_master``) and the variant's wall time."""
    start = {n: t.to(torch.bfloat16).float() for n, t in start.items()}  # every variant starts from these values
    rows = []
    for lr in lrs:
        ref, _ = run_variant(start, grads, lr, None, device)
        rows.append({"lr": lr, "variant": "fp32", **compare(start, ref, ref)})
        for rule in rules:
            t0 = time.perf_counter()
            weights, masters = run_variant(start, grads, lr, rule, device)
            row = {"lr": lr, "variant": f"bf16 {rule}", **compare(start, ref, weights),
                   "wall_s": round(time.perf_counter() - t0, 2)}
            if masters is not None:
                m = compare(start, ref, masters)
                row.update(master_changed=m["changed"], master_rel_dist=m["rel_dist"], master_cos=m["cos"])
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| lr | variant | elements changed | rel. distance from fp32 | cos to fp32 update | master copy: "
             "rel. distance / cos |", "|---|---|---|---|---|---|"]
    for r in rows:
        master = (f"{r['master_rel_dist']:.4f} / {r['master_cos']:.4f}" if "master_rel_dist" in r else "")
        lines.append(f"| {r['lr']:.0e} | {r['variant']} | {100 * r['changed']:.2f}% | {r['rel_dist']:.3f} | "
                     f"{r['cos']:.3f} | {master} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=1, help="decoder layers of the random model (SmolLM2 has 30)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    rules = [r for r in RULES if r != "stochastic_round" or importlib.util.find_spec("torchao") is not None]
    start = llama_weights(args.layers)
    grads = gradients({n: t.shape for n, t in start.items()}, args.steps)
    t0 = time.perf_counter()
    rows = measure(start, grads, rules=rules, device=device)
    params = sum(t.numel() for t in start.values())
    print(f"{params / 1e6:.1f}M parameters ({args.layers} layers), {args.steps} steps, device {args.device}, "
          f"torch {torch.__version__}, {time.perf_counter() - t0:.0f} s")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "steps": args.steps, "layers": args.layers,
                                         "params": params, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
