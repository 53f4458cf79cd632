"""Worker for tests/distributed/test_ppo_distributed.py: PPO steps under ``torchrun`` (N ranks) or in one process.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/ppo_distributed_worker.py JOB.json

JOB.json: {"cases": [{"name", "config": path, "steps"}], "out": folder}. Each case trains ``steps`` PPO
steps on the fixed rollout of ``distributed_worker.FixedEngine`` (``distributed_worker.train_fixed``: the same
completions for one process with every prompt and N ranks with 1/N of them), then rank 0 writes the policy's and the critic's
parameters and the gradients of the last optimizer step (gathered when sharded) to
``out/<name>.safetensors`` and the logged metrics to ``out/<name>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from distributed_worker import end_rank, full_state, train_fixed
from slimgrpo.config import load_config
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.trainer import Trainer

METRICS = ("loss", "grad_norm", "reward", "kl", "value/loss", "value/clipfrac", "value/mean",
           "value/returns_mean", "value/explained_variance", "ppo/kl_penalty")


def _whole(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().cpu().clone()


def critic_tensors(trainer: Trainer, grads: bool) -> dict[str, torch.Tensor]:
    """The critic's trained tensors (adapter or backbone, and head), or their gradients (collective)."""
    c = trainer.critic
    named = list(c._trainable) + [(f"head.{n}", p) for n, p in c.head.named_parameters()]
    out = {}
    for name, p in named:
        t = p.grad if grads else p
        if t is not None:
            out[("critic_grad." if grads else "critic.") + name] = _whole(t)
    return out


def policy_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    critic_ids = {id(p) for p in trainer.critic.parameters()}
    return {"grad." + n: _whole(p.grad) for n, p in trainer.policy.model.named_parameters()
            if p.grad is not None and id(p) not in critic_ids}


def run_case(case: dict, out: Path, ctx) -> None:
    from safetensors.torch import save_file

    trainer, metrics, grads = train_fixed(case, ctx, lambda t: {**policy_grads(t), **critic_tensors(t, grads=True)})
    state = {k: v for k, v in full_state(trainer).items() if ".critic." not in k}  # the critic's: below
    state.update(critic_tensors(trainer, grads=False))
    if ctx.is_main:
        save_file({**state, **grads}, str(out / f"{case['name']}.safetensors"))
        (out / f"{case['name']}.json").write_text(json.dumps([{k: m.get(k) for k in METRICS} for m in metrics]))


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    ctx = from_environment()
    if ctx.enabled:
        from slimgrpo.distributed.process_group import init_process_group

        init_process_group(load_config(job["cases"][0]["config"]), ctx)
    for case in job["cases"]:
        run_case(case, out, ctx)


if __name__ == "__main__":
    main(sys.argv[1])
    end_rank(from_environment())
