"""The update's settings, derived from the config in one place (``UpdateSettings.from_config``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimgrpo.loss.objectives import LossSettings


@dataclass(frozen=True)
class UpdateSettings:
    """How the update runs its forward and backward passes: the objective and the layout of the work.

    ``micro_rows`` / ``micro_tokens``: micro-batches by row count or by a token budget (``micro.py``);
    ``temperature``: the sampling temperature the log-probs are taken at; ``token_chunk`` / ``vocab_chunk``:
    the chunked LM head; ``fuse``: the fused head + loss where it applies; ``share_prompt``: each group's
    prompt forward once where that saves work (``layout.py``); ``offload_activations``: tensors saved for
    backward wait in host memory (``offload.py``)."""

    loss: LossSettings = field(default_factory=LossSettings)
    micro_rows: int | None = None
    micro_tokens: int | None = None
    temperature: float = 1.0
    token_chunk: int | None = None
    vocab_chunk: int | None = None
    fuse: bool = True
    share_prompt: bool = False
    offload_activations: bool = False

    @classmethod
    def from_config(cls, cfg) -> UpdateSettings:
        """The settings of ``cfg`` (a ``slimgrpo.config.Config``): its loss, memory and rollout sections."""
        from slimgrpo.loss.settings import loss_settings

        m = cfg.memory
        return cls(loss=loss_settings(cfg), micro_rows=m.micro_batch_size, micro_tokens=m.micro_batch_tokens,
                   temperature=cfg.rollout.temperature or 1.0, token_chunk=cfg.loss.token_chunk,
                   vocab_chunk=cfg.loss.vocab_chunk, fuse=cfg.loss.fuse_head_loss,
                   share_prompt=m.share_prompt_forward, offload_activations=m.offload_activations)
