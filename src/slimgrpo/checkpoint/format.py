"""Checkpoints that never corrupt what was saved before.

Layout of ``OUTPUT_DIR/checkpoints/checkpoint-<step>/``::

    model/                 weights in safetensors: the full model (Hugging Face), or the peft adapter alone
    optimizer.safetensors  optimizer tensors, flattened   (loaded without pickle)
    rng.safetensors        torch CPU/CUDA and sampling-generator states
    trainer_state.json     step, scheduler, data position, Python/NumPy RNG, optimizer structure,
                           torch thread count, trainer counters (``extra``)
    critic.safetensors     PPO only: the critic's adapter or model, and its value head (``extra_tensors``)
    metrics.jsonl          the metric history up to this step (copied from the run folder)
    config.yaml            the run's config (secrets already scrubbed)
    COMPLETE               written last: JSON manifest {"step", "files": {relative path: bytes}}

A checkpoint is first written to ``.tmp-checkpoint-<step>`` and renamed into place once COMPLETE exists,
so a kill mid-save leaves only a temporary folder that resume ignores and the next save removes.
Replacing a checkpoint of the same step moves the old one aside (``.old-checkpoint-<step>``) first;
a kill between the two renames is repaired by :func:`find_resume_checkpoint`.

There is no rollout buffer to save: every step generates, scores and consumes its own completions
(``loss.num_iterations`` re-uses them only inside that step), so nothing generated crosses a step
boundary. Nothing is unpickled on load: tensors come from safetensors, everything else from JSON.

Testing hook: ``SLIMGRPO_DEBUG_KILL_IN_SAVE=<stage>[@<step>]`` makes the process SIGKILL itself right
after ``<stage>`` (one of ``STAGES``) of the save at ``<step>`` (any step when omitted).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from slimgrpo.checkpoint.storage import replace_folder, write_folder_atomically

log = logging.getLogger("slimgrpo")

MARKER = "COMPLETE"
PREFIX = "checkpoint-"
TMP_PREFIX = f".tmp-{PREFIX}"
OLD_PREFIX = f".old-{PREFIX}"  # a checkpoint being replaced by a new save of the same step
# Stages of a save, in order, after which the debug hook can kill the process.
STAGES = ("model", "optimizer", "rng", "state", "marker", "rename")
DEBUG_KILL_ENV = "SLIMGRPO_DEBUG_KILL_IN_SAVE"


class CheckpointError(ValueError):
    """A checkpoint cannot be used with this run (different model, optimizer or data)."""


@dataclass
class Snapshot:
    """The live objects one checkpoint file set is written from, one process or many (``save_checkpoint`` of this module
    and of ``dist_checkpoint``)."""

    model: Any  # the policy (under torchrun with PPO: the module that holds policy and critic)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler_state: dict[str, int]  # the data position (``sampler.state_dict()``)
    generator: torch.Generator | None  # the sampling generator, whose state is saved with the RNGs


@dataclass
class TrainState:
    step: int
    sampler: dict[str, int]
    extra: dict[str, Any]
    num_threads: int | None = None  # torch CPU threads of the run that saved it


# ----------------------------------------------------------------------------- tensors <-> flat dicts


def flatten_state(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Move every tensor of a nested structure into ``tensors`` (keyed by path) and return the
    JSON-able skeleton that points to them."""
    if isinstance(obj, torch.Tensor) and type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
        return _flatten_subclass(obj, prefix, tensors)
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
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


# Tensor subclasses that may be rebuilt from a checkpoint (8-bit optimizer states). A checkpoint can
# only name classes under these modules, so loading one never imports arbitrary code.
SUBCLASS_MODULES = ("torchao.",)


def _flatten_subclass(t: torch.Tensor, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    names, ctx = t.__tensor_flatten__()
    cls = type(t)
    return {"__subclass__": f"{cls.__module__}:{cls.__qualname__}",
            "inner": {n: flatten_state(getattr(t, n), f"{prefix}.{n}", tensors) for n in names},
            "ctx": flatten_state(list(ctx) if isinstance(ctx, tuple) else ctx, f"{prefix}.ctx", tensors),
            "ctx_tuple": isinstance(ctx, tuple), "size": list(t.shape), "stride": list(t.stride())}


def _unflatten_subclass(skel: dict[str, Any], tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    import importlib

    module, name = skel["__subclass__"].split(":")
    if not module.startswith(SUBCLASS_MODULES):
        raise ValueError(f"checkpoint names tensor class {skel['__subclass__']!r}, which slimgrpo does not load")
    cls = getattr(importlib.import_module(module), name)
    inner = {n: unflatten_state(v, tensors) for n, v in skel["inner"].items()}
    ctx = unflatten_state(skel["ctx"], tensors)
    ctx = tuple(ctx) if skel["ctx_tuple"] else ctx
    return cls.__tensor_unflatten__(inner, ctx, torch.Size(skel["size"]), tuple(skel["stride"]))


def unflatten_state(skel: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__subclass__" in skel:
            return _unflatten_subclass(skel, tensors)
        if "__dtype__" in skel:
            return getattr(torch, skel["__dtype__"])
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
    parts: Snapshot,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None,
    protect: int | tuple[int, ...] | None = None,
) -> Path:
    """Write a checkpoint atomically (a temporary folder, a marker, a rename). ``extra_tensors``: named groups
    of tensors saved beside the model, ``<name>.safetensors`` each (PPO's critic), read by ``load_extra_tensors``.
    ``protect``: pruning spares the newest checkpoint at or before this step, or each of these steps (``_prune``)."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    # Into .tmp-checkpoint-<step> (TMP_PREFIX); disk full, quota, read-only: what this save took is freed,
    # earlier checkpoints stay, and the error names the checkpoint folder (storage.as_os_error).
    with write_folder_atomically(final, install=lambda tmp, dst: finish_save(tmp, dst, step, keep, protect)) as tmp:
        _write_checkpoint(tmp, output_dir, step, parts, extra, extra_tensors)
    return final


def _write_checkpoint(tmp: Path, output_dir, step, parts: Snapshot, extra, extra_tensors=None) -> None:
    parts.model.save_pretrained(str(tmp / "model"), safe_serialization=True)
    for name, tensors in (extra_tensors or {}).items():
        save_file(tensors, str(tmp / f"{name}.safetensors"))
    _debug_kill("model", step)
    opt_skel = save_nested(parts.optimizer.state_dict(), tmp / "optimizer.safetensors")
    _debug_kill("optimizer", step)
    rng_tensors, rng_plain = rng_state(parts.generator)
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    _debug_kill("rng", step)
    state = {
        "step": step,
        "sampler": parts.sampler_state,
        "scheduler": parts.scheduler.state_dict(),
        "optimizer": opt_skel,
        "rng": rng_plain,
        "num_threads": torch.get_num_threads(),
        "extra": extra or {},
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    copy_history(output_dir, tmp)
    _debug_kill("state", step)
    _fsync_tree(tmp)


def copy_history(output_dir: str | Path, folder: Path) -> None:
    """The metric history up to this step, and the config that produced it, travel with a checkpoint."""
    for name in ("metrics.jsonl", "config.yaml"):
        if (Path(output_dir) / name).is_file():
            shutil.copyfile(Path(output_dir) / name, folder / name)


def finish_save(tmp: Path, final: Path, step: int, keep: int, protect: int | tuple[int, ...] | None = None) -> None:
    """Marker (written last, with the file manifest), rename into place, prune: the crash-safe end of
    every save, single-process or distributed."""
    _write_marker(tmp, step)
    _debug_kill("marker", step)
    _install(tmp, final)
    _debug_kill("rename", step)
    _prune(final.parent, keep, step, protect)


def _debug_kill(stage: str, step: int) -> None:
    """Testing hook: die by SIGKILL (no cleanup, like a power cut or the OOM killer) at a chosen point."""
    spec = os.environ.get(DEBUG_KILL_ENV)
    if not spec:
        return
    want, _, at = spec.partition("@")
    if want == stage and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)


def _write_marker(folder: Path, step: int) -> None:
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    with open(folder / MARKER, "w") as f:
        json.dump({"step": step, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(folder)


def _install(tmp: Path, final: Path) -> None:
    """Rename the finished temporary folder into place. An existing checkpoint of the same step is
    moved aside first (as ``.old-checkpoint-N``, i.e. ``OLD_PREFIX``) and removed last, so some complete
    copy of this step exists at every moment."""
    replace_folder(tmp, final)
    _fsync_dir(final.parent)


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prune(root: Path, keep: int, step: int, protect: int | tuple[int, ...] | None = None) -> None:
    """Keep the newest ``keep`` checkpoints up to ``step``. Checkpoints of later steps belong to a
    continuation that was abandoned (the run went back to an earlier checkpoint): they go too, so
    ``resume=auto`` can never jump onto another trajectory. ``protect``: the newest checkpoint at or before
    this step (or each of these steps) is kept as well: the last one from before a stalled stretch
    (monitor/stall.py), the best model's (``run.keep_best``, monitor/best.py)."""
    complete = list_complete(root)
    for later in [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and _step_of(p) > step]:
        log.warning("removing %s: it is later than step %d just saved, so it belongs to an abandoned "
                    "continuation (or an earlier run) in this folder", later.name, step)
        shutil.rmtree(later, ignore_errors=True)
    current = [p for p in complete if _step_of(p) <= step]
    protects = () if protect is None else (protect,) if isinstance(protect, int) else tuple(protect)
    spared = [kept for s in protects for kept in [p for p in current if _step_of(p) <= s][-1:]]
    for old in current[:-keep]:
        if old not in spared:
            shutil.rmtree(old, ignore_errors=True)
    for leftover in [*root.glob(f"{TMP_PREFIX}*"), *root.glob(f"{OLD_PREFIX}*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def _step_of(path: Path) -> int:
    try:
        return int(path.name[len(PREFIX):])
    except ValueError:
        return -1


def checkpoint_step(path: Path) -> int:
    """The step of a ``checkpoint-<step>`` folder (from its trainer_state.json when the name says nothing)."""
    step = _step_of(path)
    if step < 0:
        try:
            step = int(json.loads((path / "trainer_state.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1
    return step


def list_complete(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and _step_of(p) >= 0]
    return sorted((p for p in found if (p / MARKER).is_file()), key=_step_of)


def _step_of_hidden(path: Path, prefix: str) -> int:
    try:
        return int(path.name[len(prefix):])
    except ValueError:
        return -1


def problem(path: Path) -> str | None:
    """Why ``path`` is not a usable checkpoint, or None when it is.

    Checks that every file is there with the size the COMPLETE manifest recorded (a truncated or
    half-copied file fails), that the JSON parses, and that every safetensors header reads. It does not
    hash tensor data: a flipped bit inside a weight is not detected."""
    if not path.is_dir():
        return "no such folder"
    if not (path / MARKER).is_file():
        if not (path / "trainer_state.json").is_file():
            return "not a checkpoint folder: it has neither a COMPLETE marker nor trainer_state.json"
        return f"no {MARKER} marker (the save was interrupted)"
    if (path / "distributed").is_dir():  # written by several ranks (dist_checkpoint.py)
        needed = ["trainer_state.json", "distributed/.metadata"]
    else:
        needed = ["trainer_state.json", "optimizer.safetensors", "rng.safetensors", "model"]
    missing = [n for n in needed if not (path / n).exists()]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        marker = (path / MARKER).read_text()
        manifest = json.loads(marker) if marker.strip().startswith("{") else {}  # early versions wrote "ok"
        for rel, size in manifest.get("files", {}).items():
            f = path / rel
            if not f.is_file():
                return f"{rel} is missing"
            if f.stat().st_size != size:
                return f"{rel} has {f.stat().st_size} bytes, the manifest says {size} (truncated or changed)"
        json.loads((path / "trainer_state.json").read_text())
        for f in sorted(path.rglob("*.safetensors")):
            with safe_open(str(f), framework="pt"):
                pass
    except Exception as e:  # any parse failure means the checkpoint is unusable
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def is_valid(path: Path) -> bool:
    return problem(path) is None


def _recover_interrupted_install(root: Path) -> None:
    """A kill between the two renames of :func:`_install` leaves this step's checkpoint only under a
    hidden name (the complete new copy in ``.tmp-``, the old one in ``.old-``): put one back."""
    for prefix in (TMP_PREFIX, OLD_PREFIX):  # the new copy first
        for hidden in root.glob(f"{prefix}*"):
            step = _step_of_hidden(hidden, prefix)
            final = root / f"{PREFIX}{step}"
            if step < 0 or final.exists() or not is_valid(hidden):
                continue
            try:
                os.replace(hidden, final)
                log.warning("recovered %s from %s (the process died while installing it)", final.name, hidden.name)
            except OSError:  # another rank got there first
                pass


def find_resume_checkpoint(output_dir: str | Path) -> Path | None:
    """Newest complete, readable checkpoint; incomplete or corrupted ones are skipped with a warning."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return None
    _recover_interrupted_install(root)
    for tmp in root.glob(f"{TMP_PREFIX}*"):
        log.warning("ignoring incomplete checkpoint %s (interrupted while saving)", tmp.name)
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and _step_of(p) >= 0]
    for path in sorted(found, key=_step_of, reverse=True):
        why = problem(path)
        if why is None:
            return path
        log.warning("skipping checkpoint %s: %s", path.name, why)
    return None


_MISMATCH_HINT = ("resume with the same model.path and lora settings, or start afresh in a new run.output_dir "
                  "(or with run.resume=never, which overwrites this folder's checkpoints as it goes)")


def load_model_weights(model, path: Path) -> None:
    """Copy saved weights into the live model (full or peft adapter)."""
    from slimgrpo.causal_lm import is_peft

    folder = path / "model"
    if is_peft(model):
        from peft import set_peft_model_state_dict

        adapter = folder / "adapter_model.safetensors"
        if not adapter.is_file():
            raise CheckpointError(f"checkpoint {path} holds full model weights but this run trains LoRA "
                                  f"adapters: {_MISMATCH_HINT}")
        result = set_peft_model_state_dict(model, load_file(str(adapter)))
        bad = [k for k in getattr(result, "unexpected_keys", []) or []]
        if bad:
            raise CheckpointError(f"the LoRA adapter in {path} does not fit this model (unexpected keys "
                                  f"{bad[:3]}): {_MISMATCH_HINT}")
        return
    files = sorted(folder.glob("*.safetensors"))
    if (folder / "adapter_model.safetensors").is_file():
        raise CheckpointError(f"checkpoint {path} holds a LoRA adapter but this run trains the full model: "
                              f"{_MISMATCH_HINT}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        first = str(e).strip().splitlines()[-1].strip()
        raise CheckpointError(f"checkpoint {path} was saved from a different model ({first}): {_MISMATCH_HINT}") \
            from None
    # Tied LM heads are saved once; everything else must match.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} was saved from a different model (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}): {_MISMATCH_HINT}")


def load_checkpoint(path: Path, model, optimizer, scheduler, generator: torch.Generator | None) -> TrainState:
    """Restore everything :func:`save_checkpoint` wrote into the live objects. Model, optimizer and RNG
    tensors come from safetensors files, the rest from JSON: nothing is unpickled."""
    state = json.loads((path / "trainer_state.json").read_text())
    load_model_weights(model, path)
    try:
        optimizer.load_state_dict(load_nested(state["optimizer"], path / "optimizer.safetensors"))
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"the optimizer state in {path} does not fit this run's optimizer ({e}): "
                              f"keep memory.optimizer and the trained parameters unchanged, or {_MISMATCH_HINT}") \
            from None
    scheduler.load_state_dict(state["scheduler"])
    restore_rng(load_file(str(path / "rng.safetensors")), state["rng"], generator)
    threads = state.get("num_threads")
    if threads and threads != torch.get_num_threads():
        log.warning(
            "this run uses %d torch threads, the run that saved %s used %d: on CPU, reductions split "
            "across threads round differently, so the continuation may differ from an uninterrupted run "
            "in the last bits. Set run.num_threads=%d for a bit-identical continuation.",
            torch.get_num_threads(), path.name, threads, threads,
        )
    return TrainState(step=int(state["step"]), sampler=state["sampler"], extra=state.get("extra", {}),
                      num_threads=threads)


def load_extra_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    """A group of ``extra_tensors`` saved with the checkpoint at ``path``."""
    f = path / f"{name}.safetensors"
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path} has no {f.name}: it was saved by a run without a {name} "
                              f"(e.g. GRPO, not PPO); {_MISMATCH_HINT}")
    return load_file(str(f))


def nonfinite_diagnosis(streak: int, step: int, output_dir: str | Path, at_end: bool = False) -> str:
    """The message that stops a run after ``streak`` consecutive non-finite steps (the last one ``step``)."""
    complete = [p for p in list_complete(checkpoint_dir(output_dir)) if is_valid(p)]
    if complete:
        where = (f"The last good checkpoint, {complete[-1]} (step {_step_of(complete[-1])}), is untouched: "
                 "fix the cause and run the same command to resume from it (to change optim.* or other keys that "
                 f"cannot change on resume, name it: run.resume={complete[-1]}).")
    else:
        where = "No checkpoint had been saved yet (run.save_steps sets how often one is)."
    if at_end:
        what = (f"the run reached step {step} with its last {streak} update(s) skipped for a NaN/inf loss or "
                "gradient (update_skipped=1 in metrics.jsonl): the model now gives NaN/inf, so no final model "
                "was saved. ")
    else:
        what = (f"stopped at step {step}: {streak} consecutive steps had a NaN/inf loss or gradient, so their "
                "updates were skipped (update_skipped=1 in metrics.jsonl) and the run stopped "
                "(run.max_nonfinite_steps). ")
    return (
        what +
        "Likely causes: a learning rate too high (optim.learning_rate), float16 overflow (use "
        "model.dtype=bfloat16), or reward values so large that their sum or spread overflows (check the "
        f"rewards/* metrics). {where}"
    )
