"""The update stage of a GRPO / PPO step, as one component (``Updater``).

- ``updater.py``: ``Updater``: ``prepare(rollout, advantages) -> UpdateBatch``, ``step(batch) -> (stats,
  grad_norm, skipped)``: the normaliser, the optimizer loop, clipping, the reference sync, the entropy
  controller, PPO's critic beside the policy;
- ``settings.py``: ``UpdateSettings``, derived from the config in one place;
- ``gradients.py``: the passes over a batch: log-probs without gradients, forward + backward per micro-batch;
- ``micro_loss.py``: the loss of one micro-batch (fused head + loss where it applies);
- ``layout.py``: the forward layout (unpadded / packed / shared prompt) behind one ``HiddenFn``, chosen once;
- ``batch.py``: the batch, its optimizer-step slices, the statistics;
- ``micro.py``: the micro-batches: which rows go together, each one's rows as the loss takes them;
- ``shared_prompt.py``, ``offload.py``: the shared-prompt layout; activations offloaded to host memory.
"""

from slimgrpo.update.batch import UpdateBatch, UpdateStats, make_update_batch, merge_stats, split_update
from slimgrpo.update.micro import MicroBatch, micro_batch, plan_micro, trimmed
from slimgrpo.update.settings import UpdateSettings

__all__ = ["MicroBatch", "UpdateBatch", "UpdateSettings", "UpdateStats", "make_update_batch", "merge_stats",
           "micro_batch", "plan_micro", "split_update", "trimmed"]
