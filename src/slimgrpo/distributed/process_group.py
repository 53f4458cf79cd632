"""The process group of a torchrun job: join it (``init_process_group``), check that every rank holds the same
config and that a step's prompts split over the ranks (``check_job``), and leave it together.

    torchrun --nproc_per_node N -m slimgrpo train CONFIG
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from slimgrpo.config import Config, ConfigError
from slimgrpo.distributed.context import DistContext
from slimgrpo.distributed.wrap import decoder_layers

log = logging.getLogger("slimgrpo")

def resolve_backend(cfg: Config) -> str:
    """``distributed.backend``: nccl when CUDA is available (and the run uses it), gloo otherwise."""
    wanted = cfg.distributed.backend
    uses_cuda = torch.cuda.is_available() and cfg.run.device != "cpu"
    if wanted == "auto":
        return "nccl" if uses_cuda else "gloo"
    if wanted == "nccl" and not uses_cuda:
        raise ConfigError("distributed.backend=nccl needs CUDA devices; on CPU use distributed.backend=gloo "
                          "(or auto)")
    return wanted


def init_process_group(cfg: Config, ctx: DistContext) -> None:
    """Join the job torchrun started (RANK / WORLD_SIZE / MASTER_ADDR in the environment).

    On CUDA each rank uses the GPU of its ``LOCAL_RANK``; ``run.device`` must then be ``auto`` or
    ``cuda``. Collectives that wait longer than ``distributed.timeout_s`` fail with a timeout error."""
    backend = resolve_backend(cfg)
    timeout = timedelta(seconds=cfg.distributed.timeout_s)
    ctx.timeout_s = cfg.distributed.timeout_s
    kwargs: dict[str, Any] = {}
    if torch.cuda.is_available() and cfg.run.device != "cpu":
        if cfg.run.device not in ("auto", "cuda"):
            raise ConfigError(
                f"run.device={cfg.run.device!r} under torchrun: every rank would use the same GPU. Use "
                "run.device=auto; each rank takes the GPU of its LOCAL_RANK (limit them with CUDA_VISIBLE_DEVICES)"
            )
        if ctx.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK={ctx.local_rank} but this node has {torch.cuda.device_count()} "
                              "GPU(s): use --nproc_per_node <= the number of GPUs")
        torch.cuda.set_device(ctx.local_rank)
        if backend == "nccl":
            kwargs["device_id"] = torch.device("cuda", ctx.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    if dist.get_world_size() != ctx.world_size or dist.get_rank() != ctx.rank:
        raise RuntimeError(f"process group (rank {dist.get_rank()} of {dist.get_world_size()}) does not match "
                           f"the environment (RANK={ctx.rank}, WORLD_SIZE={ctx.world_size})")
    if not ctx.is_main:  # one voice on the console: other ranks report warnings and errors only
        logging.getLogger("slimgrpo").setLevel(logging.WARNING)
    log.info("process group: %d ranks, backend %s, strategy %s, collective timeout %gs", ctx.world_size, backend,
             cfg.distributed.strategy, cfg.distributed.timeout_s)


def check_job(cfg: Config, ctx: DistContext) -> None:
    """Right after the process group starts, before any weight is loaded: every rank must hold the same
    config, and the prompts of a step must split evenly over the ranks. Every rank takes part in the
    comparison and raises the same ``ConfigError`` (exit 2), so no rank is left waiting for another. With
    ``distributed.strategy=fsdp`` the model must have decoder layers to shard (``fsdp_problem``)."""
    import hashlib
    import json

    def name(obj: Any) -> str:  # callables set from Python: by name (their repr has a per-process address)
        return getattr(obj, "__qualname__", None) or type(obj).__name__

    mine = json.loads(json.dumps(cfg.to_dict(), sort_keys=True, default=name))
    digests = ctx.all_gather_object(hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest())
    if len(set(digests)) > 1:
        flats = [_flatten(c) for c in ctx.all_gather_object(mine)]
        lines = []
        for rank, flat in enumerate(flats[1:], start=1):
            keys = sorted(k for k in set(flat) | set(flats[0]) if flat.get(k) != flats[0].get(k))
            lines += [f"rank {rank} has {k}={flat.get(k)!r} where rank 0 has {flats[0].get(k)!r}" for k in keys]
        more = f" (and {len(lines) - 5} more)" if len(lines) > 5 else ""
        _refuse(ctx, "the ranks of this torchrun job disagree on the config: " + "; ".join(lines[:5]) + more
                + ". Start every rank with the same config file and overrides")
    problem = fsdp_problem(cfg) if cfg.distributed.strategy == "fsdp" else None
    if problem:
        _refuse(ctx, problem)
    problem = split_problem(cfg, ctx.world_size)
    if problem:
        _refuse(ctx, problem)


def split_problem(cfg: Config, world_size: int) -> str | None:
    """Why the prompts of a step cannot be shared evenly by ``world_size`` processes (None: they can). The
    torchrun job checks it before any weight loads (``check_job``), the Python API when it builds the run."""
    if cfg.prompts_per_step % world_size == 0:
        return None
    return (f"run.batch_size={cfg.run.batch_size} gives {cfg.prompts_per_step} prompts per step "
            f"(rollout.num_generations={cfg.rollout.num_generations}), which {world_size} processes cannot "
            f"share evenly: use a multiple of {world_size * cfg.rollout.num_generations} for run.batch_size, "
            f"or a number of processes that divides {cfg.prompts_per_step}")


def fsdp_problem(cfg: Config) -> str | None:
    """Why ``distributed.strategy=fsdp`` cannot shard this model (no decoder layers to put in groups), read
    off the model built on the meta device from its config alone: no weight is read. None when it can, or
    when the model is not a local folder (the load then says what is wrong)."""
    from pathlib import Path

    from slimgrpo.config import resolve_path

    folder = Path(resolve_path(cfg, cfg.model.path))
    if not (folder / "config.json").is_file():
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=cfg.model.trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.model.trust_remote_code)
    except Exception:  # noqa: BLE001 - not this check's to report: loading the model will say it
        return None
    try:
        decoder_layers(model)
    except ConfigError as e:
        return f"{folder}: {e}"
    return None


def _refuse(ctx: DistContext, message: str) -> None:
    """Every rank refuses the job with the same message, after leaving the process group together."""
    leave_process_group(ctx)
    raise ConfigError(message)


def leave_process_group(ctx: DistContext) -> None:
    """Every rank leaves together (a barrier, then ``destroy_process_group``): a gloo rank whose peer exits
    under it can abort (SIGABRT), and NCCL warns about a group that was never destroyed."""
    ctx.barrier()
    dist.destroy_process_group()


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out
