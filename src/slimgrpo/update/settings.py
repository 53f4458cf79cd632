"""The update's settings, derived from the config in one place (``UpdateSettings.from_config``), with the
planner's shared-prompt verdict read there once (``plan.prompt_sharing.PromptSharing``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slimgrpo.loss.objectives import LossSettings
from slimgrpo.plan.prompt_sharing import PromptSharing


@dataclass(frozen=True)
class UpdateSettings:
    """How the update runs its forward and backward passes: the objective and the layout of the work.

    ``micro_rows`` / ``micro_tokens``: micro-batches by row count or by a token budget (``micro.py``);
    ``same_micro_count``: FSDP2, where every forward and backward is a collective, so every rank runs as many
    micro-batches as the rank with the most (``micro.micro_batches`` asks the ranks); ``temperature``: the
    sampling temperature the log-probs are taken at; ``token_chunk`` / ``vocab_chunk``: the chunked LM head;
    ``fuse``: the fused head + loss where it applies; ``share_prompt``: each group's prompt forward once where
    that saves work and the planner finds it lighter (``plan.prompt_sharing.PromptSharing``, read from the model
    once; None: never; ``layout.py``);
    ``offload_activations``: tensors saved for backward wait in host memory (``offload.py``)."""

    loss: LossSettings = field(default_factory=LossSettings)
    micro_rows: int | None = None
    micro_tokens: int | None = None
    same_micro_count: bool = False
    temperature: float = 1.0
    token_chunk: int | None = None
    vocab_chunk: int | None = None
    fuse: bool = True
    share_prompt: PromptSharing | None = None
    offload_activations: bool = False

    @classmethod
    def from_config(cls, cfg, model: Any) -> UpdateSettings:
        """The settings of ``cfg`` (a ``slimgrpo.config.Config``): its loss, memory, rollout and distributed
        sections; ``model`` (the policy's causal LM): what ``memory.share_prompt_forward`` asks the planner
        about (``PromptSharing.of``)."""
        from slimgrpo.loss.settings import loss_settings

        m = cfg.memory
        sharing = PromptSharing.of(model) if m.share_prompt_forward else None
        return cls(loss=loss_settings(cfg), micro_rows=m.micro_batch_size, micro_tokens=m.micro_batch_tokens,
                   same_micro_count=cfg.distributed.strategy == "fsdp", temperature=cfg.rollout.temperature or 1.0,
                   token_chunk=cfg.loss.token_chunk, vocab_chunk=cfg.loss.vocab_chunk, fuse=cfg.loss.fuse_head_loss,
                   share_prompt=sharing, offload_activations=m.offload_activations)
