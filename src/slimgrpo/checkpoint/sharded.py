"""Checkpoints of a multi-process run (torch.distributed.checkpoint) and its final Hugging Face folder.

Layout of ``OUTPUT_DIR/checkpoints/checkpoint-<step>/`` written by N ranks::

    distributed/             DCP: model + optimizer state; each rank writes its own shards (FSDP2) or
                             its share of the replicated tensors (DDP); frozen weights (LoRA base) left out
    rng-rank<r>.safetensors  torch / sampling-generator state of rank r
    rng-rank<r>.json         Python / NumPy RNG state of rank r
    trainer_state.json       step, scheduler, data position, world size, strategy, trainer counters
    metrics.jsonl            the metric history up to this step; config.yaml: the run's config
    COMPLETE                 written last, by rank 0, after every rank finished: a manifest of every
                             file and its size, which ``checkpoint.problem`` checks before resuming

As for single-process checkpoints, everything is first written to ``.tmp-checkpoint-<step>`` and renamed
once complete, so a kill mid-save never damages the previous checkpoint. A checkpoint resumes on the same
number of ranks with the same strategy (different counts are refused with a message). The output folder
must be one file system that every rank sees (a shared mount on several nodes).

The final model is ONE Hugging Face folder: FSDP2 shards are gathered into a full state dict on rank 0
(in CPU memory) and written with ``save_pretrained``; with DDP rank 0 saves its own full copy.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from slimgrpo.checkpoint import format as ckpt
from slimgrpo.distributed.context import DistContext

DCP_DIR = "distributed"
FORMAT = "slimgrpo-dcp-1"


def is_distributed(path: Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def _state_dict_options(loading: bool = False):
    """Frozen weights (the LoRA base) are neither saved nor loaded: they never change. Loading is then
    non-strict about them only: ``dcp.load`` fails on its own when a trainable tensor is missing."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=not loading)


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    parts: ckpt.Snapshot,
    dist: DistContext,
    strategy: str,
    keep: int = 2,
    extra: dict[str, Any] | None = None,
    protect: int | tuple[int, ...] | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint folder (on every rank). ``protect``: see
    ``checkpoint._prune``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = ckpt.checkpoint_dir(output_dir)
    final = root / f"{ckpt.PREFIX}{step}"
    tmp = root / f"{ckpt.TMP_PREFIX}{step}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    model_sd, optim_sd = get_state_dict(parts.model, parts.optimizer, options=_state_dict_options())
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
    rng_tensors, rng_plain = ckpt.rng_state(parts.generator)
    save_file(rng_tensors, str(tmp / f"rng-rank{dist.rank}.safetensors"))
    (tmp / f"rng-rank{dist.rank}.json").write_text(json.dumps(rng_plain))
    _fsync_files([tmp / f"rng-rank{dist.rank}.safetensors", tmp / f"rng-rank{dist.rank}.json",
                  *(tmp / DCP_DIR).glob(f"__{dist.rank}_*")])
    dist.barrier()
    if dist.is_main:
        state = {"format": FORMAT, "step": step, "sampler": parts.sampler_state,
                 "scheduler": parts.scheduler.state_dict(),
                 "world_size": dist.world_size, "strategy": strategy, "extra": extra or {}}
        (tmp / "trainer_state.json").write_text(json.dumps(state))
        ckpt.copy_history(output_dir, tmp)
        _fsync_files([tmp / "trainer_state.json", tmp / DCP_DIR / ".metadata"])
        ckpt.finish_save(tmp, final, step, keep, protect)
    dist.barrier()
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, generator: torch.Generator | None,
                    dist: DistContext, strategy: str) -> ckpt.TrainState:
    """Collective: restore model, optimizer, scheduler and this rank's RNG from a checkpoint written by
    the same number of ranks with the same strategy."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    if not is_distributed(path):
        raise ValueError(
            f"{path} was written by a single process; a run under torchrun resumes only checkpoints of the same "
            f"number of ranks. Resume it without torchrun, or start afresh with run.resume=never"
        )
    state = json.loads((path / "trainer_state.json").read_text())
    saved_world, saved_strategy = int(state["world_size"]), state.get("strategy")
    if saved_world != dist.world_size or saved_strategy != strategy:
        raise ValueError(
            f"{path} was written by {saved_world} ranks with distributed.strategy={saved_strategy}; this run has "
            f"{dist.world_size} ranks with strategy={strategy}. Resume with the same torchrun --nproc_per_node "
            f"(x --nnodes) and strategy, or start afresh with run.resume=never"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_state_dict_options())
    loaded = {"model": model_sd, "optim": optim_sd}
    dcp.load(loaded, checkpoint_id=str(path / DCP_DIR))
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"],
                   options=_state_dict_options(loading=True))
    scheduler.load_state_dict(state["scheduler"])
    plain = json.loads((path / f"rng-rank{dist.rank}.json").read_text())
    ckpt.restore_rng(load_file(str(path / f"rng-rank{dist.rank}.safetensors")), plain, generator)
    return ckpt.TrainState(step=int(state["step"]), sampler=state["sampler"], extra=state.get("extra", {}))


def save_hf_model(policy, path: Path, dist: DistContext) -> None:
    """Collective: the trained model (or LoRA adapter) as ONE Hugging Face folder, written by rank 0.

    FSDP2-sharded weights are gathered into a full state dict held in rank 0's CPU memory (other ranks
    get nothing), so the folder loads with plain ``from_pretrained``."""
    from torch.distributed.tensor import DTensor

    model = policy.model
    sharded = any(isinstance(p, DTensor) for p in model.parameters())
    state_dict: dict[str, Any] | None = None
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_main:
        from slimgrpo.checkpoint.storage import write_folder_atomically

        with write_folder_atomically(path) as tmp:  # renamed to ``path`` once complete
            if state_dict is not None:
                model.save_pretrained(str(tmp), state_dict=_untie(model, state_dict), safe_serialization=True)
            else:
                model.save_pretrained(str(tmp), safe_serialization=True)
            policy.tokenizer.save_pretrained(str(tmp))
    dist.barrier()


def _untie(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gathering copies each tensor, so a tied LM head comes back as a second tensor equal to the
    embedding; drop it as ``save_pretrained`` would drop a shared one (the config re-ties it on load)."""
    from slimgrpo.causal_lm import unwrap_causal_lm

    base = unwrap_causal_lm(model)
    if not getattr(base.config, "tie_word_embeddings", False):
        return state_dict
    head, emb = base.get_output_embeddings(), base.get_input_embeddings()
    names = {id(m): n for n, m in base.named_modules()}
    head_key, emb_key = f"{names.get(id(head))}.weight", f"{names.get(id(emb))}.weight"
    if head_key in state_dict and emb_key in state_dict and head_key != emb_key:
        state_dict = {k: v for k, v in state_dict.items() if k != head_key}
    return state_dict


def _fsync_files(paths) -> None:
    for p in paths:
        if Path(p).is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
