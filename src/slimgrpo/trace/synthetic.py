"""Update-only steps on synthetic completions: the policy update of a GRPO step without decoding.

Measuring the memory of a long-context update (e.g. 8 completions x 20K tokens) by really sampling
20K tokens per row costs 20K decode steps. The update does not care what the tokens are, only how
many there are, so this module builds a :class:`~slimgrpo.containers.Rollout` of random token ids with
pinned lengths and runs the trainer's own update stage on it (``update/``: ``Updater.update``: old / reference
log-probs, micro-batched forward + backward through the chunked loss, gradient clipping, optimizer step) -- the
same code a real step runs after scoring.

    from slimgrpo.runspec.shape import load_shape
    from slimgrpo.trace.synthetic import random_causal_lm, synthetic_rollout, UpdateOnly

    shape = load_shape("llama-3.1-8b")
    model = random_causal_lm(shape, torch.bfloat16, "cuda")
    runner = UpdateOnly(cfg, model)           # cfg: a Config (lora, memory, loss, optim sections)
    stats = runner.step(synthetic_rollout(1, 8, 256, 20_000, shape.vocab, device="cuda"))

Works on any device and any shape that :mod:`slimgrpo.runspec.shape` describes (llama, mistral,
qwen2, qwen3 families). Nothing is downloaded: weights are random.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from slimgrpo.config import Config
from slimgrpo.containers import Rollout
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.target import DeviceTarget


def hf_config(shape: ModelShape, pad_token_id: int = 0, eos_token_id: int = 1, attn_implementation: str = "sdpa",
              **overrides: Any):
    """A transformers config of ``shape`` (family llama / mistral / qwen2 / qwen3); ``overrides`` are
    further config fields (e.g. ``initializer_range``)."""
    import transformers

    classes = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}
    cls = getattr(transformers, classes[shape.family])
    kwargs: dict[str, Any] = dict(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tie,
        max_position_embeddings=shape.max_positions or 32_768,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=eos_token_id,
    )
    cfg = cls(**{**kwargs, **overrides})
    cfg._attn_implementation = attn_implementation
    return cfg


def random_causal_lm(shape: ModelShape, dtype: torch.dtype, device: str | torch.device, seed: int = 0,
                     attn_implementation: str = "sdpa", **config_overrides: Any):
    """A randomly initialised causal LM of ``shape``, created directly on ``device`` in ``dtype`` (an 8B
    model never exists in fp32 or on the host). ``config_overrides`` go to :func:`hf_config`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                hf_config(shape, attn_implementation=attn_implementation, **config_overrides))
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype)


PAD_ID = 0  # the padding id of synthetic rollouts; no real token takes it


@dataclass(frozen=True)
class RaggedLengths:
    """Lengths of a ragged synthetic batch: ``prompts`` ([groups] tokens each) and ``completions`` ([rows]);
    either may be None (every prompt ``prompt_length`` / every completion ``completion_length`` tokens)."""

    prompts: list[int] | None = None
    completions: list[int] | None = None


def synthetic_rollout(groups: int, num_generations: int, prompt_length: int, completion_length: int, vocab: int,
                      device: str | torch.device = "cpu", seed: int = 0,
                      lengths: RaggedLengths | None = None) -> Rollout:
    """A Rollout of random token ids (never the padding id ``PAD_ID``).

    By default every prompt has ``prompt_length`` tokens and every completion ``completion_length`` (the
    work is pinned, like ``min_completion_length = max_completion_length``), none truncated.
    ``lengths`` gives ragged batches instead: prompts are left-padded, completions right-padded, as the
    rollout engine returns them; a row whose length equals ``completion_length`` counts as truncated (no EOS
    was sampled)."""
    lengths = lengths or RaggedLengths()
    prompt_lengths, completion_lengths, pad_token_id = lengths.prompts, lengths.completions, PAD_ID
    rows = groups * num_generations
    g = torch.Generator().manual_seed(seed)
    p_lens = list(prompt_lengths) if prompt_lengths is not None else [prompt_length] * groups
    c_lens = list(completion_lengths) if completion_lengths is not None else [completion_length] * rows
    if len(p_lens) != groups or len(c_lens) != rows:
        raise ValueError(f"need {groups} prompt lengths and {rows} completion lengths, got {len(p_lens)} / {len(c_lens)}")
    if vocab < 2:
        raise ValueError("vocab must be at least 2 (one id is padding)")
    P, T = max(p_lens), max(c_lens)
    if not 0 < P <= prompt_length or not 0 < T <= completion_length:
        raise ValueError("lengths must be positive and at most prompt_length / completion_length")

    def ids(n: int, m: int) -> torch.Tensor:
        x = torch.randint(0, vocab - 1, (n, m), generator=g)
        return x + (x >= pad_token_id).long()  # skip the padding id

    prompt_ids, completion_ids = ids(groups, P), ids(rows, T)
    cols_p, cols_c = torch.arange(P), torch.arange(T)
    prompt_mask = cols_p.unsqueeze(0) >= (P - torch.tensor(p_lens)).unsqueeze(1)
    completion_mask = cols_c.unsqueeze(0) < torch.tensor(c_lens).unsqueeze(1)
    prompt_ids[~prompt_mask] = pad_token_id
    completion_ids[~completion_mask] = pad_token_id
    truncated = torch.tensor([c >= completion_length for c in c_lens]) if completion_lengths is not None \
        else torch.zeros(rows, dtype=torch.bool)
    sampler = torch.zeros(rows, T, dtype=torch.float32)
    return Rollout(prompt_ids.to(device), prompt_mask.to(device), completion_ids.to(device),
                   completion_mask.to(device), truncated.to(device), sampler.to(device), num_generations)


def synthetic_advantages(rows: int, num_generations: int, seed: int = 0) -> torch.Tensor:
    """Group-normalised random advantages (non-zero, so every row has a gradient)."""
    from slimgrpo.advantage.estimators import grpo_advantages

    g = torch.Generator().manual_seed(seed + 1)
    return grpo_advantages(torch.rand(rows, generator=g), num_generations, "group")


@dataclass
class UpdateOnlyResult:
    loss: float
    grad_norm: float
    skipped: bool
    tokens: int
    seconds: float


class UpdateOnly:
    """The trainer's update stage (``update.Updater.update``) around a given model.

    ``cfg`` supplies the ``lora``, ``memory``, ``loss``, ``optim`` and ``rollout`` sections as for a
    real run (``model.path`` and ``data`` are not read). LoRA adapters, gradient checkpointing and the
    full-fine-tuning reference copy are applied as ``build_policy`` applies them, unless ``prepared``:
    then ``model`` has been through ``prepare_for_training`` already and ``reference_cpu`` is its
    reference copy (``trace/step.py`` prepares a ``meta`` model before materialising it). ``spec`` and
    ``target``: the update's resolved spec and device target (``update.Updater``; a trace passes both)."""

    def __init__(self, cfg: Config, model, device: str | torch.device | None = None, prepared: bool = False,
                 reference_cpu=None, spec: RunSpec | None = None, target: DeviceTarget | None = None):
        from slimgrpo.modeling import Policy, prepare_for_training
        from slimgrpo.update.optim import build_optimizer, build_scheduler
        from slimgrpo.update.settings import UpdateSettings
        from slimgrpo.update.updater import Updater

        device = torch.device(device) if device is not None else next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        if not prepared:
            model, reference_cpu = prepare_for_training(model, cfg)  # exactly as build_policy does
        self.policy = Policy(model, None, device, dtype, reference_cpu)
        optimizer = build_optimizer(self.policy.trainable_parameters(), cfg, device)
        settings = UpdateSettings.of(cfg, model, spec, target)
        self.updater = Updater(cfg, self.policy, model, optimizer, build_scheduler(optimizer, cfg), settings=settings)
        self.cfg = cfg

    @property
    def trainer(self):
        """The update stage (``updater``), by the name it had when a trainer held it (``runner.trainer.optimizer``)."""
        return self.updater

    @property
    def model(self):
        return self.updater.model

    def step(self, rollout: Rollout, advantages: torch.Tensor | None = None) -> UpdateOnlyResult:
        """One optimizer step on ``rollout`` exactly as ``Trainer.step`` does after scoring."""
        if advantages is None:
            advantages = synthetic_advantages(rollout.rows, rollout.num_generations)
        t = time.perf_counter()
        result = self.updater.update(rollout, advantages.to(self.policy.device))
        if self.policy.device.type == "cuda":
            torch.cuda.synchronize(self.policy.device)
        return UpdateOnlyResult(result.stats.loss, result.grad_norm, result.skipped, result.stats.tokens,
                                time.perf_counter() - t)


def update_config(overrides: dict[str, Any] | None = None) -> Config:
    """A Config for :class:`UpdateOnly` from nested overrides, e.g. ``{"lora": {"enabled": True}}``."""
    from slimgrpo.config import from_dict

    return from_dict(overrides or {})
