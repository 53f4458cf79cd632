"""Worker for tests/distributed/test_distributed.py, run under ``torchrun`` (N ranks) or in one process.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_worker.py JOB.json

JOB.json: {"cases": [{"name", "config": path, "steps"}], "generation": [config paths], "out": folder}.

``cases``: train ``steps`` steps on a FIXED rollout (``FixedEngine``: completions that depend only on the
prompt and the row within its group, so one process with every prompt and N ranks with 1/N of them see
the same completions), then rank 0 writes the full parameters and the last gradients to
``out/<name>.safetensors``. ``generation``: greedy rollouts through the FSDP2-sharded model must equal
greedy rollouts of an unsharded copy of the same weights (``out/generation-<i>.json`` from each rank).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from slimgrpo.config import load_config
from slimgrpo.rollout.engine import TorchRolloutEngine, left_pad
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs, build_run
from slimgrpo.train.trainer import Trainer
from slimgrpo.containers import Rollout


class FixedEngine:
    """Deterministic completions: row g of a prompt is a function of (prompt ids, g) only."""

    off_policy = False  # the RolloutEngine protocol: the live weights' samples, no per-step figures, nothing to free
    metrics: dict[str, float] = {}

    def close(self) -> None:
        pass

    def __init__(self, vocab_size: int, eos_id: int, pad_id: int, max_new: int):
        self.vocab_size, self.eos_id, self.pad_id, self.max_new = vocab_size, eos_id, pad_id, max_new

    def generate(self, prompt_ids, num_generations, params, generator=None) -> Rollout:
        rows = []
        for p in prompt_ids:
            seed = sum((i + 1) * t for i, t in enumerate(p)) % (2**31)
            for g in range(num_generations):
                gen = torch.Generator().manual_seed(seed * 131 + g)
                length = int(torch.randint(1, self.max_new + 1, (1,), generator=gen))
                toks = torch.randint(3, self.vocab_size, (length,), generator=gen)
                ends = length < self.max_new or bool(torch.rand(1, generator=gen) < 0.5)
                if ends:
                    toks[-1] = self.eos_id
                rows.append((toks, not ends))
        T = max(len(t) for t, _ in rows)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), T, dtype=torch.bool)
        for i, (t, _) in enumerate(rows):
            ids[i, : len(t)] = t
            mask[i, : len(t)] = True
        prompt, prompt_mask = left_pad(prompt_ids, self.pad_id, torch.device("cpu"))
        return Rollout(prompt, prompt_mask, ids, mask, torch.tensor([tr for _, tr in rows]),
                       torch.zeros(len(rows), T), num_generations)


def full_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter of the model, gathered when sharded (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if trainer.dist.enabled:
        sd = get_model_state_dict(trainer.policy.model, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
    else:
        sd = trainer.policy.model.state_dict()
    return {k: v.detach().float().cpu().clone() for k, v in sd.items()}


def full_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in trainer.policy.model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            out["grad." + name] = g.detach().float().cpu().clone()
    return out


def train_fixed(case: dict, ctx, last_grads: Callable[[Trainer], dict[str, torch.Tensor]],
                ) -> tuple[Trainer, list[dict], dict[str, torch.Tensor]]:
    """Train ``case["steps"]`` steps on ``FixedEngine``'s rollout (this worker's GRPO cases and
    ppo_distributed_worker's PPO cases). Returns the trainer, each step's metrics and ``last_grads(trainer)``
    as the optimizer saw them at the last step (after clipping; collective when sharded)."""
    cfg = load_config(case["config"])
    parts = build_run(cfg, RunInputs(ctx))
    tok = parts.policy.tokenizer
    fixed = FixedEngine(len(tok), tok.eos_token_id, tok.pad_token_id, cfg.rollout.max_completion_length)
    trainer = Trainer(dataclasses.replace(parts, engine=fixed))
    grads: dict[str, torch.Tensor] = {}

    def record(optimizer, args, kwargs):  # the gradients the optimizer sees (after clipping)
        grads.clear()
        grads.update(last_grads(trainer))

    trainer.optimizer.register_step_pre_hook(record)
    metrics = []
    for _ in range(case["steps"]):
        metrics.append(trainer.step().metrics)
        trainer.step_idx += 1
    return trainer, metrics, grads


def run_case(case: dict, out: Path, ctx) -> None:
    from safetensors.torch import save_file

    trainer, metrics, grads = train_fixed(case, ctx, full_grads)
    state = full_state(trainer)
    if ctx.is_main:
        save_file({**state, **grads}, str(out / f"{case['name']}.safetensors"))
        keep = ("loss", "grad_norm", "reward", "kl", "entropy", "length_mod/mean_tokens")
        (out / f"{case['name']}.json").write_text(json.dumps([{k: m[k] for k in keep} for m in metrics]))


def run_generation(i: int, config: str, out: Path, ctx) -> None:
    """Greedy rollouts through the sharded model vs an unsharded copy of the same weights."""
    from torch.distributed.tensor import DTensor

    from slimgrpo.modeling import build_policy
    from slimgrpo.rollout.sampling import SamplingParams

    cfg = load_config(config)
    trainer = Trainer(cfg, dist=ctx)
    batch = trainer.next_batch()
    params = SamplingParams(max_new_tokens=cfg.rollout.max_completion_length, temperature=0.0,
                            eos_token_ids=trainer.sampling.eos_token_ids, pad_token_id=trainer.sampling.pad_token_id)
    for _ in range(2):  # twice: the weights must be sharded again after the first rollout
        sharded = trainer.engine.generate(batch.prompt_ids, 2, params)
        assert all(isinstance(p, DTensor) for p in trainer.policy.model.parameters())
    uneven = {}
    if cfg.distributed.fsdp_generation == "per_layer":
        # Ranks that would run different numbers of forwards: rank 0's prompts are narrower (fewer prefill
        # chunks of 3 positions) and every token ends its rows at once; rank 1 never meets an EOS.
        trainer.engine.engine.prefill_chunk = 3
        vocab = trainer.policy.model.config.vocab_size
        prompts = [p[:4] for p in batch.prompt_ids] if ctx.rank == 0 else batch.prompt_ids
        uneven_params = SamplingParams(max_new_tokens=cfg.rollout.max_completion_length, temperature=0.0,
                                       eos_token_ids=tuple(range(vocab)) if ctx.rank == 0 else (),
                                       pad_token_id=trainer.sampling.pad_token_id)
        uneven["uneven_sharded"] = trainer.engine.generate(prompts, 2, uneven_params).completion_ids.tolist()
    reference = build_policy(cfg).model
    plain = TorchRolloutEngine(reference).generate(batch.prompt_ids, 2, params)
    if uneven:
        uneven["uneven_plain"] = TorchRolloutEngine(reference, prefill_chunk=3).generate(
            prompts, 2, uneven_params).completion_ids.tolist()
    (out / f"generation-{i}-rank{ctx.rank}.json").write_text(json.dumps({
        "sharded": sharded.completion_ids.tolist(), "plain": plain.completion_ids.tolist(),
        "type": type(trainer.engine).__name__, **uneven,
    }))


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    ctx = from_environment()
    if ctx.enabled:
        from slimgrpo.distributed.process_group import init_process_group

        init_process_group(load_config(job["cases"][0]["config"] if job.get("cases") else job["generation"][0]),
                           ctx)
    for case in job.get("cases", []):
        run_case(case, out, ctx)
    for i, config in enumerate(job.get("generation", [])):
        run_generation(i, config, out, ctx)


def end_rank(ctx) -> None:
    """A rank ends as the ``slimgrpo`` command's ranks do: the ranks leave the process group together, then
    ``commands/cli.py``'s ``_leave_rank`` exits without the interpreter's teardown, whose C++ destructors of
    gloo and the sharded model were seen to abort a finished rank (SIGABRT), which torchrun reports as a
    failed job."""
    from slimgrpo.commands.cli import _leave_rank

    if ctx.enabled:
        from slimgrpo.distributed.process_group import leave_process_group

        leave_process_group(ctx)
    _leave_rank(0)


if __name__ == "__main__":
    main(sys.argv[1])
    end_rank(from_environment())
