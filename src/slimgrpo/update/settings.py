"""The update's settings, derived in one place (``UpdateSettings.of``) from the run's config and resolved spec
(the memory-shaping choices the plan counted), with the model read once for the shared-prompt verdict
(``forward.layout.PromptSharing``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import dataclasses

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.config import auto_token_chunk
from slimgrpo.forward.layout import PromptSharing
from slimgrpo.loss.objectives import LossSettings
from slimgrpo.loss.settings import loss_settings
from slimgrpo.runspec.run import RunSpec, run_spec
from slimgrpo.target import DeviceTarget


@dataclass(frozen=True)
class UpdateSettings:
    """How the update runs its forward and backward passes: the objective and the layout of the work.

    ``micro_rows`` / ``micro_tokens``: micro-batches by row count (None: all rows) or by a token budget
    (``micro.py``); ``same_micro_count``: FSDP2, where every forward and backward is a collective, so every rank
    runs as many micro-batches as the rank with the most (``micro.micro_batches`` asks the ranks);
    ``temperature``: the sampling temperature the log-probs are taken at; ``token_chunk`` / ``vocab_chunk``: the
    chunked LM head; ``fuse``: the fused head + loss where it applies (the spec's verdict, ``runspec.run.fused_loss``;
    ``micro_loss`` takes the separate path on an optimizer step whose adaptive entropy coefficient is not 0);
    ``share_prompt``: each group's prompt forward once where that saves work and is lighter
    (``forward.layout.PromptSharing``, read from the model once; None: never); ``offload_activations``: tensors
    saved for backward wait in host memory (``offload.py``); ``target``: the device whose memory choices the
    passes take (None: each tensor's own; a memory trace gives a simulated one); ``off_policy``: the rollouts
    come from another engine (vLLM), whose samples the update corrects for (``sampler_correction.py``)."""

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
    target: DeviceTarget | None = None
    off_policy: bool = False

    @classmethod
    def of(cls, cfg, model: Any, spec: RunSpec | None = None, target: DeviceTarget | None = None,
           world_size: int = 1) -> UpdateSettings:
        """The settings of a run of ``cfg`` (a ``slimgrpo.config.Config``: its loss and rollout sections) whose
        resolved spec is ``spec`` (None: the config's own on the model's device, one of ``world_size``
        processes); ``model`` (the policy's causal LM) is read for its vocabulary and the shared-prompt verdict.
        ``loss.token_chunk`` unset becomes the automatic size for the model's vocabulary, written into ``cfg`` (so
        the run's saved config.yaml names the size it used)."""
        if cfg.loss.token_chunk is None:
            cfg.loss.token_chunk = auto_token_chunk(unwrap_causal_lm(model).config.vocab_size)
        if spec is None:
            kind = target.kind if target is not None else DeviceTarget.of(next(model.parameters())).kind
            spec = run_spec(cfg, kind, world_size)
        spec = dataclasses.replace(spec, token_chunk=cfg.loss.token_chunk)  # the model's own vocabulary's
        return cls.from_spec(spec, loss_settings(cfg), cfg.rollout.temperature or 1.0, model, target)

    @classmethod
    def from_spec(cls, spec: RunSpec, loss: LossSettings, temperature: float, model: Any,
                  target: DeviceTarget | None = None) -> UpdateSettings:
        """The settings of a run whose resolved spec is ``spec`` (one rank's share), whose loss settings are
        ``loss`` (``loss/settings.py``) and whose rollouts sample at ``temperature``; ``model`` (the policy's
        causal LM): what the shared-prompt verdict reads (``PromptSharing.of``)."""
        sharing = PromptSharing.of(model) if spec.share_prompt_forward else None
        micro_rows = spec.micro_batch_rows if spec.micro_batch_rows < spec.rows else None
        return cls(loss=loss, micro_rows=micro_rows, micro_tokens=spec.micro_batch_tokens,
                   same_micro_count=spec.fsdp_shards > 1, temperature=temperature, token_chunk=spec.token_chunk,
                   vocab_chunk=spec.vocab_chunk, fuse=spec.fused_loss, share_prompt=sharing,
                   offload_activations=spec.offload_activations, target=target,
                   off_policy=spec.rollout_engine == "vllm")
