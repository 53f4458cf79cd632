"""The run folder and its checkpoints as one component: the lock, the plan (resume, fresh, refuse, already
finished), saving and loading checkpoints, the final model.

    checkpoints = Checkpointer(cfg, dist, output_dir)    # train/build.py's build_run: holds no lock yet
    checkpoints.lock_folder()                           # build_run: rank 0 takes the folder's lock
    plan = checkpoints.plan_folder()                    # build_run: decided before anything is written
    checkpoints.attach(CheckpointParts(...))             # build_run: what a checkpoint saves and restores
    step = checkpoints.resume()                         # the step to go on from (0: a fresh run)
    checkpoints.save(step)                              # a checkpoint (DCP under torchrun)
    checkpoints.save_model(output_dir / "final")        # the final model, written atomically
    checkpoints.save_final(best_step, last_step)        # final/ (run.keep_best: the best; the last in last/)
    checkpoints.release()                               # the lock, however the run ends

One process writes ``checkpoint/format.py``'s checkpoints (PPO's critic as extra tensors beside the policy);
under torchrun every rank writes its part of a distributed (DCP) one (``checkpoint/sharded.py``), the
critic inside it. The folder's decisions are ``checkpoint/run_folder.py``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slimgrpo.config import resolve_path
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.checkpoint import sharded as dist_ckpt
from slimgrpo.checkpoint import run_folder
from slimgrpo.distributed.context import DistContext
from slimgrpo.update.optim import apply_config_after_resume
from slimgrpo.checkpoint.storage import write_folder_atomically

log = logging.getLogger("slimgrpo")


@dataclass
class CheckpointParts:
    """What a checkpoint saves and a resume restores: the policy (and PPO's ``critic``), the optimizer and
    scheduler, the data order (``sampler``), the sampling ``generator``, the updater's entropy controller,
    the watch's streak (``monitor/watch.py``), and the metrics ``writer`` whose history is cut back to the
    checkpoint."""

    policy: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    generator: torch.Generator
    updater: Any
    watch: Any
    writer: Any
    critic: Any = None


class Checkpointer:
    """The run folder and checkpoints of one run (module docstring). ``cfg``: its ``run`` section (resume,
    overwrite, save_* and the limits) and ``distributed.strategy``; ``dist``: the ranks; ``output_dir``: the
    run folder; ``run_lock``: the folder's lock when the caller already holds it (the demo), else None."""

    def __init__(self, cfg, dist: DistContext, output_dir: Path, run_lock=None):
        self.cfg, self.dist, self.output_dir = cfg, dist, output_dir
        self.run_lock = run_lock  # rank 0 holds the run folder's lock from the build to the end of the run
        self.plan = run_folder.Plan()
        self.parts: CheckpointParts | None = None  # attach() in train/build.py's build_run

    # ------------------------------------------------------------------------- the folder

    def lock_folder(self) -> None:
        with self.dist.agree("locking the run folder"):  # one writer per folder; rank 0 holds the lock
            if self.dist.is_main and self.run_lock is None:
                self.run_lock = run_folder.open_folder(self.output_dir)

    def plan_folder(self) -> run_folder.Plan:
        """Rank 0 decides (and with run.overwrite=true moves an earlier run aside); then every rank reads
        the same decision from the folder."""
        resolve = lambda p: resolve_path(self.cfg, p)  # noqa: E731
        plan = None
        with self.dist.agree("checking the run folder"):
            if self.dist.is_main:
                plan, self.run_lock = run_folder.prepare(self.cfg, self.output_dir, self.run_lock, resolve)
        with self.dist.agree("checking the run folder"):  # rank 0 writes nothing until every rank has read
            if plan is None:
                plan = run_folder.plan(self.cfg, self.output_dir, resolve)
        self.plan = plan
        return plan

    def already_finished(self) -> dict[str, Any]:
        steps = self.plan.finished.get("steps")
        if self.plan.finished.get("stopped_by") == "early_stopping":
            log.warning("%s: already finished: early stopping stopped it at step %s (final/ is its best model); "
                        "nothing to do. To train on, name its checkpoint: run.resume=%s; or start afresh with "
                        "run.resume=never run.overwrite=true.", self.output_dir, steps, self.plan.resume_from)
            return {**self.plan.finished, "already_finished": True}
        log.warning("%s: already finished at step %s (run.max_steps=%d); nothing to do. Raise run.max_steps to "
                    "train further, or start afresh with run.resume=never run.overwrite=true.",
                    self.output_dir, steps, self.cfg.run.max_steps)
        return {**self.plan.finished, "already_finished": True}

    def release(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
            self.run_lock = None

    # ------------------------------------------------------------------------- checkpoints

    def attach(self, parts: CheckpointParts) -> None:
        self.parts = parts

    def resume(self) -> int:
        """Restore the plan's checkpoint, if any; returns the step to go on from (0: a fresh run)."""
        p, path = self.parts, self.plan.resume_from
        if path is None:
            p.writer.truncate_after(0)  # a fresh run: only an attempt stopped before any checkpoint was here
            return 0
        if self.dist.enabled or dist_ckpt.is_distributed(path):  # DCP, every rank, same number of ranks
            state = dist_ckpt.load_checkpoint(path, self.saved_modules(), p.optimizer, p.scheduler, p.generator,
                                              self.dist, self.cfg.distributed.strategy)
        else:
            state = ckpt.load_checkpoint(path, p.policy.model, p.optimizer, p.scheduler, p.generator)
        apply_config_after_resume(p.optimizer, p.scheduler, self.cfg)  # e.g. a lower optim.learning_rate
        p.sampler.load_state_dict(state.sampler)
        p.updater.entropy_control.load_state_dict(state.extra.get("entropy_control", {}))
        p.updater.loss_scale.load_state_dict(state.extra.get("loss_scale", {}))  # a float16 policy's
        if p.critic is not None and not self.dist.enabled:  # (under torchrun it is in the DCP state)
            p.critic.load_state_dict(ckpt.load_extra_tensors(path, "critic"))
        p.writer.truncate_after(state.step, saved_history=path / "metrics.jsonl")
        # (under torchrun a rank may not see rank 0's file: all ranks start afresh)
        p.watch.resume(state.extra, None if self.dist.enabled else p.writer.history())
        log.info("resumed from %s at step %d", path, state.step)
        return state.step

    def resume_from(self, path: Path) -> int:
        """Restore the checkpoint at ``path`` now (over whatever the build restored): the step to go on from.
        A Python caller naming a checkpoint after the build (TRL's ``train(resume_from_checkpoint=PATH)``)."""
        if self.parts is None:  # the build found the run finished: nothing was attached to load into
            raise ValueError(f"resume_from_checkpoint={str(path)!r}: the run in {self.output_dir} already finished "
                             f"(run.max_steps={self.cfg.run.max_steps}); raise max_steps to train on")
        why = ckpt.problem(path) if not dist_ckpt.is_distributed(path) else None
        if not path.is_dir() or why is not None:
            raise ValueError(f"resume_from_checkpoint={str(path)!r}: not a complete checkpoint folder"
                             f"{': ' + why if why else ''}")
        self.plan = run_folder.Plan(resume_from=path)
        return self.resume()

    def save(self, step: int) -> Path | None:
        if not self.cfg.run.save_checkpoints:
            return None
        p = self.parts
        if self.dist.enabled:  # DCP: every rank writes its part
            return dist_ckpt.save_checkpoint(
                self.output_dir, step, self.checkpoint_parts(self.saved_modules()), self.dist,
                self.cfg.distributed.strategy, keep=self.cfg.run.save_total_limit, extra=self.extra(),
                protect=p.watch.protected_steps(),
            )
        if not self.dist.is_main:
            self.dist.barrier()
            return None
        path = ckpt.save_checkpoint(
            self.output_dir, step, self.checkpoint_parts(p.policy.model), keep=self.cfg.run.save_total_limit,
            extra=self.extra(), extra_tensors={"critic": p.critic.state_dict()} if p.critic else None,
            protect=p.watch.protected_steps(),  # the last one before a stalled stretch, the best model's: kept
        )
        self.dist.barrier()
        return path

    def checkpoint_parts(self, model) -> ckpt.Snapshot:
        """``model`` (the policy, or ``saved_modules()`` under torchrun) with the optimizer, scheduler, data
        position and sampling generator, as a checkpoint saves them."""
        p = self.parts
        return ckpt.Snapshot(model, p.optimizer, p.scheduler, p.sampler.state_dict(), p.generator)

    def saved_modules(self):
        """What a distributed checkpoint holds with the optimizer: the policy, and PPO's critic beside it."""
        p = self.parts
        return p.critic.checkpoint_module(p.policy.model) if p.critic else p.policy.model

    def extra(self) -> dict[str, Any]:
        """Run counters saved with a checkpoint (restored by ``resume``)."""
        p = self.parts
        return {**p.watch.state_dict(), "entropy_control": p.updater.entropy_control.state_dict(),
                "loss_scale": p.updater.loss_scale.state_dict()}

    def save_final(self, best_step: int | None, last_step: int) -> dict[str, Any]:
        """The run's model at the end: ``final/``. With ``run.keep_best`` and a best judgement before the last
        step, the last step's model goes to ``last/`` first, then the best checkpoint's weights are loaded
        into the policy and saved as ``final/``; a best checkpoint damaged on disk (or that fails to load)
        leaves ``final/`` the last step's model, with a warning naming the file. Returns summary.json's
        ``final_step`` (the step whose model ``final/`` holds) and ``last_model_dir``."""
        final = self.output_dir / "final"
        if not self.cfg.run.keep_best or best_step is None or best_step == last_step:
            self.save_model(final)
            return {"final_step": last_step} if self.cfg.run.keep_best else {}
        root = ckpt.checkpoint_dir(self.output_dir)
        best = root / f"{ckpt.PREFIX}{best_step}"
        last = self.output_dir / "last"
        self.save_model(last)
        why = ckpt.problem(best)  # manifest sizes, JSON, safetensors headers (every rank reads the same folder)
        if why is None:
            try:
                self.load_weights(best)
            except Exception as e:  # noqa: BLE001: any failure to load leaves the last step's model
                why = f"it failed to load ({type(e).__name__}: {e})"
                self.load_weights(root / f"{ckpt.PREFIX}{last_step}")  # the last step's weights back
        if self.dist.any_true(why is not None):
            log.warning("the best checkpoint, %s (step %d), is damaged: %s. final/ holds the last step's model "
                        "(step %d) instead, as last/ does.", best, best_step, why or "on another rank",
                        last_step)
            self.save_model(final)
            return {"final_step": last_step, "last_model_dir": str(last), "best_checkpoint_problem": why}
        self.save_model(final)
        return {"final_step": best_step, "last_model_dir": str(last)}

    def load_weights(self, path: Path) -> None:
        """The model of the checkpoint at ``path`` into the live policy (a distributed checkpoint restores the
        rest of its state too: harmless at the end of a run)."""
        p = self.parts
        if self.dist.enabled or dist_ckpt.is_distributed(path):
            dist_ckpt.load_checkpoint(path, self.saved_modules(), p.optimizer, p.scheduler, p.generator, self.dist,
                                      self.cfg.distributed.strategy)
        else:
            ckpt.load_model_weights(p.policy.model, path)

    def save_model(self, path: Path) -> None:
        """Written into a hidden temporary folder and renamed to ``path`` when complete: a full disk leaves
        no half-written ``final/`` (and exits 2 naming it), the last checkpoint stays as it was."""
        policy = self.parts.policy
        if self.dist.enabled:
            return dist_ckpt.save_hf_model(policy, path, self.dist)
        with write_folder_atomically(path) as tmp:
            policy.model.save_pretrained(str(tmp), safe_serialization=True)
            policy.tokenizer.save_pretrained(str(tmp))
