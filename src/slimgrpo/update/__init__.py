"""The update stage of a GRPO / PPO step, as one component (``Updater``).

- ``updater.py``: ``Updater``: ``update(rollout, advantages) -> UpdateResult`` (the stage's one call: the batch
  prepared, the optimizer loop, clipping, the reference sync, the entropy controller, PPO's critic beside the
  policy; the statistics, the gradient norm and whether the step was skipped come back frozen);
- ``settings.py``: ``UpdateSettings``, derived from the config in one place (``UpdateSettings.of``), with the
  shared-prompt verdict read once (``forward.layout.PromptSharing``);
- ``micro.py``: the one iterator of micro-batches (``micro_batches``) every pass takes, the policy's and the
  critic's: which rows go together, the same count on every FSDP2 rank, each one's rows as the loss takes them;
- ``gradients.py``: the passes over a batch: log-probs without gradients, forward + backward per micro-batch;
- ``micro_loss.py``: the loss of one micro-batch (fused head + loss where it applies);
- ``batch.py``: the batch, its totals over the ranks, its optimizer-step slices, the statistics;
- ``critic.py``: PPO's value function; ``offload.py``: activations offloaded to host memory; ``reference.py``: the
  full-fine-tuning reference streamed from host memory; ``optim.py``: optimizers and schedules; ``costs.py``: the
  stage's memory cost lines (what the planner adds up).

How the rows of a micro-batch reach the LM head (unpadded, packed, shared prompt) is ``slimgrpo.forward``'s.
"""

from slimgrpo.update.batch import (BatchTotals, UpdateBatch, UpdateStats, batch_totals, make_update_batch, merge_stats,
                                   split_update)
from slimgrpo.update.micro import MicroBatch, MicroBatches, micro_batch, micro_batches, plan_micro, trimmed
from slimgrpo.update.settings import UpdateSettings

__all__ = ["BatchTotals", "MicroBatch", "MicroBatches", "UpdateBatch", "UpdateSettings",
           "UpdateStats", "batch_totals", "make_update_batch", "merge_stats", "micro_batch", "micro_batches",
           "plan_micro", "split_update", "trimmed"]
