"""Checkpoints that never corrupt what was saved before.

Layout of ``OUTPUT_DIR/checkpoints/checkpoint-<step>/``::

    model/ or adapter/     weights in safetensors (Hugging Face / peft format)
    optimizer.safetensors  optimizer tensors, flattened   (loaded without pickle)
    rng.safetensors        torch CPU/CUDA and sampling-generator states
    trainer_state.json     step, scheduler, data position, Python/NumPy RNG, optimizer structure
    COMPLETE               written last

A checkpoint is first written to ``.tmp-checkpoint-<step>`` and renamed into place once COMPLETE exists,
so a kill mid-save leaves only a temporary folder that resume ignores and the next save removes.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger("slimgrpo")

MARKER = "COMPLETE"
PREFIX = "checkpoint-"


@dataclass
class TrainState:
    step: int
    sampler: dict[str, int]
    extra: dict[str, Any]


# ----------------------------------------------------------------------------- tensors <-> flat dicts


def flatten_state(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Move every tensor of a nested structure into ``tensors`` (keyed by path) and return the
    JSON-able skeleton that points to them."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        return {"__dict__": [[flatten_state(k, f"{prefix}.k{i}", tensors), flatten_state(v, f"{prefix}.{i}", tensors)]
                             for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        items = [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return {"__float__": repr(obj)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__} at {prefix}")


def unflatten_state(skel: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__dict__" in skel:
            return {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in skel["__dict__"]}
        if "__tuple__" in skel:
            return tuple(unflatten_state(v, tensors) for v in skel["__tuple__"])
        if "__float__" in skel:
            return float(skel["__float__"])
    if isinstance(skel, list):
        return [unflatten_state(v, tensors) for v in skel]
    return skel


def save_nested(obj: Any, path: Path) -> Any:
    tensors: dict[str, torch.Tensor] = {}
    skel = flatten_state(obj, "s", tensors)
    save_file(tensors, str(path))
    return skel


def load_nested(skel: Any, path: Path) -> Any:
    return unflatten_state(skel, load_file(str(path)))


# ----------------------------------------------------------------------------- RNG


def rng_state(generator: torch.Generator | None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    if generator is not None:
        tensors["sampling"] = generator.get_state()
    py = random.getstate()
    np_state = np.random.get_state()
    plain = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return tensors, plain


def restore_rng(tensors: dict[str, torch.Tensor], plain: dict[str, Any], generator: torch.Generator | None) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
        if states:
            torch.cuda.set_rng_state_all(states)
    if generator is not None and "sampling" in tensors:
        generator.set_state(tensors["sampling"])
    py = plain["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = plain["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))


# ----------------------------------------------------------------------------- save / load


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    sampler_state: dict[str, int],
    generator: torch.Generator | None,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    tmp = root / f".tmp-{PREFIX}{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(str(tmp / "model"), safe_serialization=True)
    opt_skel = save_nested(optimizer.state_dict(), tmp / "optimizer.safetensors")
    rng_tensors, rng_plain = rng_state(generator)
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    state = {
        "step": step,
        "sampler": sampler_state,
        "scheduler": scheduler.state_dict(),
        "optimizer": opt_skel,
        "rng": rng_plain,
        "extra": extra or {},
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    _fsync_tree(tmp)
    (tmp / MARKER).write_text("ok\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, keep)
    return final


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _prune(root: Path, keep: int) -> None:
    complete = list_complete(root)
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for tmp in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _step_of(path: Path) -> int:
    try:
        return int(path.name[len(PREFIX):])
    except ValueError:
        return -1


def list_complete(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and _step_of(p) >= 0]
    return sorted((p for p in found if (p / MARKER).is_file()), key=_step_of)


def is_valid(path: Path) -> bool:
    needed = ["trainer_state.json", "optimizer.safetensors", "rng.safetensors", MARKER]
    if not all((path / n).is_file() for n in needed) or not (path / "model").is_dir():
        return False
    try:
        json.loads((path / "trainer_state.json").read_text())
        load_file(str(path / "rng.safetensors"))
    except Exception:  # any parse failure means the checkpoint is unusable
        return False
    return True


def find_resume_checkpoint(output_dir: str | Path) -> Path | None:
    """Newest complete, readable checkpoint; incomplete or corrupted ones are skipped with a warning."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return None
    for tmp in root.glob(f".tmp-{PREFIX}*"):
        log.warning("ignoring incomplete checkpoint %s (interrupted while saving)", tmp.name)
    for path in reversed(list_complete(root)):
        if is_valid(path):
            return path
        log.warning("skipping corrupted checkpoint %s", path)
    for p in root.glob(f"{PREFIX}*"):
        if p.is_dir() and not (p / MARKER).is_file():
            log.warning("skipping incomplete checkpoint %s (no %s marker)", p.name, MARKER)
    return None


def load_model_weights(model, path: Path) -> None:
    """Copy saved weights into the live model (full or peft adapter)."""
    from slimgrpo.modeling import is_peft

    folder = path / "model"
    if is_peft(model):
        from peft import set_peft_model_state_dict

        weights = load_file(str(folder / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, weights)
        bad = [k for k in getattr(result, "unexpected_keys", []) or []]
        if bad:
            raise RuntimeError(f"checkpoint adapter has unexpected keys: {bad[:5]}")
        return
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied LM heads are saved once; everything else must match.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {folder} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")


def load_checkpoint(path: Path, model, optimizer, scheduler, generator: torch.Generator | None) -> TrainState:
    state = json.loads((path / "trainer_state.json").read_text())
    load_model_weights(model, path)
    optimizer.load_state_dict(load_nested(state["optimizer"], path / "optimizer.safetensors"))
    scheduler.load_state_dict(state["scheduler"])
    restore_rng(load_file(str(path / "rng.safetensors")), state["rng"], generator)
    return TrainState(step=int(state["step"]), sampler=state["sampler"], extra=state.get("extra", {}))
