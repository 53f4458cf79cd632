"""Update-only child for memory calibration: one real slimgrpo update on synthetic completions.

    python -m benchmarks.children.update_only CONFIG.yaml [key=value ...]

Builds the Trainer exactly as ``slimgrpo train`` does (policy, LoRA, checkpointing, optimizer), then
skips decoding: every row gets a random prompt of ``data.max_prompt_length`` tokens and a random
completion of ``rollout.max_completion_length`` tokens (the planner's worst case, all rows full length).
The optimizer state is created first (one zero-gradient step), so the measured update runs with it
resident, as every step after the first of a real run does. Then one update (``Updater.update``):
reference / old log-probs when the config asks for them, forward + backward over the micro-batches, the
optimizer step. Peak RSS is read from outside (planner/calibrate_memory.py, harness/measure.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from benchmarks.harness.records import emit


def main(argv: list[str]) -> int:
    from benchmarks.surface import Rollout, Trainer, load_config

    cfg = load_config(Path(argv[0]), argv[1:])
    trainer = Trainer(cfg)  # built whole
    G, groups = cfg.rollout.num_generations, cfg.prompts_per_step
    P, T = cfg.data.max_prompt_length, cfg.rollout.max_completion_length
    vocab = trainer.policy.model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    rows = groups * G
    dev = trainer.policy.device
    rollout = Rollout(
        prompt_ids=torch.randint(3, vocab, (groups, P), generator=g).to(dev),
        prompt_mask=torch.ones(groups, P, dtype=torch.bool, device=dev),
        completion_ids=torch.randint(3, vocab, (rows, T), generator=g).to(dev),
        completion_mask=torch.ones(rows, T, dtype=torch.bool, device=dev),
        is_truncated=torch.zeros(rows, dtype=torch.bool, device=dev),
        sampler_logprobs=torch.zeros(rows, T, device=dev),
        num_generations=G,
    )
    params = trainer.policy.trainable_parameters()
    for p in params:  # create the optimizer state (a run's steady state) before the measured update
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    result = trainer.updater.update(rollout, torch.randn(rows, generator=g).to(dev), trainer.step_idx)
    trainer.watch.after_update(result.skipped, trainer.step_idx)
    emit({"kind": "update", "rows": rows, "P": P, "T": T, "update_s": time.perf_counter() - t0,
          "loss": result.stats.loss, "tokens": result.stats.tokens, "skipped": result.skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
