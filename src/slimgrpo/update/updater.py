"""The update stage of a step as one component and one call: a rollout and its advantages in, an
``UpdateResult`` out.

    settings = UpdateSettings.of(cfg, policy.model, spec)     # the run's resolved spec (spec/run.py)
    updater = Updater(cfg, policy, model, optimizer, scheduler, dist, critic, settings)
    result = updater.update(rollout, advantages, step_idx)   # result.stats, .grad_norm, .skipped, .metrics

Inside, in this order: the batch with what the loss compares against (old / reference log-probs, the entropy
cut: ``prepare``), PPO's critic (its values become per-token GAE advantages), the correction for another
engine's samples (``rollout.engine=vllm``: TRL's truncated importance-sampling weights), then ``num_iterations``
passes of optimizer steps. Each stage returns a new batch; nothing the caller holds is changed.

``Trainer.step`` calls it; ``trace/synthetic.py`` (update-only steps) and ``trace/step.py`` (``plan --trace``)
build one around a given model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from slimgrpo.advantage.gae import PPOSettings, ppo_advantages
from slimgrpo.containers import Rollout
from slimgrpo.distributed import wrap as launch
from slimgrpo.distributed.context import DistContext
from slimgrpo.loss.entropy_control import EntropyController
from slimgrpo.update.batch import (UpdateBatch, UpdateStats, batch_totals, make_update_batch, merge_stats,
                                   policy_normaliser, split_update)
from slimgrpo.update.gradients import accumulate_gradients, batch_logprobs, entropy_cut
from slimgrpo.update.loss_scale import LossScale
from slimgrpo.update.reference import reference_on_device
from slimgrpo.update.sampler_correction import correct_for_sampler
from slimgrpo.update.settings import UpdateSettings


def trainable_parameters(policy, critic=None) -> list[torch.nn.Parameter]:
    """What the optimizer trains: the policy's parameters, then the critic's (PPO)."""
    return policy.trainable_parameters() + (critic.parameters() if critic else [])


@dataclass(frozen=True)
class UpdateResult:
    """What one update returns: its statistics (this rank's), the last gradient norm, whether it was skipped (a
    loss or the gradient norm was not finite: its gradients were dropped and the passes stopped there), each row's
    advantage as the loss took it (PPO: the row's mean GAE advantage), the learning rate after it, the
    entropy-bonus coefficient (None without the bonus), a float16 policy's loss scale (None otherwise), PPO's
    critic numbers before the update (``value_metrics``) and the sampler's mismatch with the training forward
    (``sampler_metrics``: another engine's samples)."""

    stats: UpdateStats
    grad_norm: float
    skipped: bool
    advantages: torch.Tensor  # [rows]
    learning_rate: float
    entropy_coef: float | None = None
    loss_scale: float | None = None
    value_metrics: dict[str, Any] = field(default_factory=dict)
    sampler_metrics: dict[str, float] = field(default_factory=dict)


class Updater:
    """The policy update of one step (module docstring).

    ``cfg``: its ``loss``, ``optim``, ``rollout`` and ``distributed`` sections are read (and ``critic`` by PPO's
    critic); ``policy``: the ``modeling.Policy`` (reference, device, trainable parameters); ``model``: the model
    the update runs, a DDP / FSDP2 wrapper under torchrun; ``critic``: PPO's value function
    (``update/critic.py``), trained beside the policy in every optimizer step; ``settings``: how the passes run
    (``UpdateSettings.of``: from the run's resolved spec, ``runspec/run.py``), None: the config's own on the
    policy's device."""

    def __init__(self, cfg, policy, model, optimizer, scheduler, dist: DistContext | None = None, critic=None,
                 settings: UpdateSettings | None = None):
        self.cfg, self.policy, self.model, self.critic = cfg, policy, model, critic
        self.optimizer, self.scheduler = optimizer, scheduler
        self.dist = dist or DistContext()
        self.settings = settings or UpdateSettings.of(cfg, policy.model, world_size=self.dist.world_size)
        self.entropy_control = EntropyController.from_config(cfg.loss)  # entropy bonus coefficient
        self.ppo_settings = PPOSettings.from_config(cfg.loss)  # PPO's KL reward, GAE, whitening
        self.loss_scale = LossScale.for_model(policy.model)  # a float16 policy's dynamic loss scale, else 1

    def parameters(self) -> list[torch.nn.Parameter]:
        return trainable_parameters(self.policy, self.critic)

    def update(self, rollout: Rollout, advantages: torch.Tensor, step_idx: int = 0) -> UpdateResult:
        """One step's update of ``rollout`` scored with ``advantages`` [rows] (module docstring); ``step_idx``:
        steps before this one (the reference sync counts optimizer steps)."""
        batch = self.prepare(rollout, advantages)
        batch, row_advantages, value_metrics = self._critic_stage(batch, advantages)
        sampler_metrics = {}
        if self.settings.off_policy:
            batch, sampler_metrics = self._correct_for_sampler(batch, rollout)
        stats, grad_norm, skipped = self._step(batch, step_idx)
        coef = self.entropy_control.coef if self.settings.loss.entropy_bonus else None  # after the update
        return UpdateResult(stats, grad_norm, skipped, row_advantages, self.scheduler.get_last_lr()[0], coef,
                            self.loss_scale.value if self.loss_scale.active else None, value_metrics,
                            sampler_metrics)

    def prepare(self, rollout: Rollout, advantages: torch.Tensor) -> UpdateBatch:
        """The rows of ``rollout`` with what the loss compares against: the old policy's log-probs (when the
        policy moves before the last pass, or for PPO's KL reward), the reference's (a KL term), the entropy cut.
        The first part of ``update``, public for what inspects it (tests, benchmarks)."""
        cfg, settings = self.cfg, self.settings
        batch = make_update_batch(rollout, advantages, cfg.loss.mask_truncated_completions)
        if cfg.needs_old_logp:
            batch = dataclasses.replace(batch, old_logp=batch_logprobs(self.model, batch, settings, self.dist))
        if cfg.needs_reference:
            sharded_root = self.model if cfg.distributed.strategy == "fsdp" and self.dist.enabled else None
            # a streamed full-fine-tuning reference computes on the device (update/reference.py)
            with self.policy.reference(sharded_root) as ref_model, reference_on_device(self.policy, ref_model) as ref:
                batch = dataclasses.replace(batch, ref_logp=batch_logprobs(ref, batch, settings, self.dist))
        return dataclasses.replace(batch, entropy_cut=entropy_cut(self.model, batch, settings, self.dist))

    def _critic_stage(self, batch: UpdateBatch, advantages: torch.Tensor
                      ) -> tuple[UpdateBatch, torch.Tensor, dict[str, Any]]:
        """PPO: the scores become per-token advantages (values, KL reward, GAE): the batch with them, each row's
        mean advantage for the log and the critic's numbers. Without a critic: the batch and advantages as given."""
        if self.critic is None:
            return batch, advantages, {}
        values = self.critic.batch_values(batch, self.settings)  # at sampling time
        ppo = ppo_advantages(advantages, values, batch.loss_mask, batch.old_logp, batch.ref_logp,
                             self.ppo_settings, self.dist)  # advantage/gae.py
        batch = dataclasses.replace(batch, loss_mask=ppo.mask, advantages=ppo.advantages,  # unscorable rows leave
                                    returns=ppo.returns, old_values=values)
        return batch, ppo.row_mean, ppo.metrics

    def _correct_for_sampler(self, batch: UpdateBatch, rollout: Rollout) -> tuple[UpdateBatch, dict[str, float]]:
        """Another engine's samples (``rollout.engine=vllm``): the log-prob mismatch measured, TRL's truncated
        importance-sampling weights folded into the batch's advantages (``update/sampler_correction.py``)."""
        return correct_for_sampler(batch, rollout.sampler_logprobs, rollout.model_mask, self.cfg.rollout,
                                   lambda: batch_logprobs(self.model, batch, self.settings, self.dist))

    def _step(self, batch: UpdateBatch, step_idx: int = 0) -> tuple[UpdateStats, float, bool]:
        """``num_iterations`` passes over the batch, each one optimizer step per ``steps_per_generation`` slice,
        then one scheduler step. Returns ``(stats, grad_norm, skipped)``. Every ``.grad`` is None when it
        returns."""
        cfg = self.cfg
        slices = split_update(batch, cfg.loss.steps_per_generation)
        totals = [batch_totals(part, self.dist) for part in slices]  # rows and tokens over every rank
        world = self.dist.world_size
        norms = [policy_normaliser(part, t, self.settings.loss, world) for part, t in zip(slices, totals)]
        params = self.parameters()
        stats = None
        grad_norm = float("nan")
        skipped = False
        opt_step = step_idx * cfg.loss.num_iterations * len(slices)  # optimizer steps before this one
        for _ in range(cfg.loss.num_iterations):
            step_stats = []
            for part, part_totals, norm in zip(slices, totals, norms):
                part_stats, grad_norm = self._gradients(part, part_totals, norm, params)
                step_stats.append(part_stats)
                self._update_entropy_control(part_stats)
                if not math.isfinite(grad_norm) or not math.isfinite(part_stats.loss):
                    skipped = True  # its gradients are dropped below, with every step's
                    break
                self.optimizer.step()
                self.loss_scale.stepped()
                opt_step += 1
                if cfg.loss.sync_ref_model and opt_step % cfg.loss.ref_model_sync_steps == 0:
                    self.policy.sync_reference(cfg.loss.ref_model_mixup_alpha)
            stats = merge_stats(step_stats)
            if skipped:
                break
        # Freed now rather than at the next step's first backward: a full fine-tune's gradients are as large as
        # the trained weights and would otherwise sit through the next generation and prepare.
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return stats, grad_norm, skipped

    def _gradients(self, part: UpdateBatch, part_totals, norm, params) -> tuple[UpdateStats, float]:
        """The gradients of one optimizer step's slice, unscaled and clipped: ``(stats, grad_norm)``. A float16
        policy's backward runs at its loss scale; a non-finite norm with a finite loss is the scale's overflow,
        so the slice runs again at half the scale (update/loss_scale.py)."""
        cfg = self.cfg
        max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            scale = self.loss_scale.value
            stats = accumulate_gradients(
                self.model, part, self.settings, norm, self.dist, entropy_coef=self.entropy_control.applied(),
                loss_scale=float(self.dist.world_size) * scale, no_sync=getattr(self.model, "no_sync", None))
            if self.critic is not None:  # PPO: the value loss's gradients beside the policy's
                stats.extra.update(self.critic.gradients(part, self.settings, part_totals, cfg, loss_scale=scale))
            self.loss_scale.unscale(params)
            grad_norm = launch.clip_grad_norm(params, max_norm)
            if math.isfinite(grad_norm) or not math.isfinite(stats.loss) or not self.loss_scale.overflowed():
                return stats, grad_norm

    def _update_entropy_control(self, stats: UpdateStats) -> None:
        """Adaptive entropy control after an optimizer step, from every rank's entropy over the bonus tokens."""
        if not self.entropy_control.adaptive:
            return
        local = torch.tensor([stats.bonus_entropy_sum, stats.bonus_tokens], dtype=torch.float64)
        total, count = self.dist.all_reduce_sum(local.to(self.policy.device)).cpu().tolist()
        self.entropy_control.update(total, count)
