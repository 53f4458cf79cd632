"""PPO's critic (``loss.advantage_estimator: gae``): a value head on a backbone; it produces values and trains
on the value loss. The per-token advantages made from its values (GAE, whitening) are ``advantage/gae.py``'s.

Where the critic's backbone lives (docs/ppo.md has the memory picture):

- LoRA: a second peft adapter (``CRITIC_ADAPTER``, the same ``lora.*`` settings) on the policy's own frozen
  base, switched on for the critic's passes only. One copy of the base weights serves the policy (adapter
  ``default``), the critic (adapter ``critic`` + value head) and the reference (adapters off).
- Full fine-tuning: a second causal LM loaded from ``critic.model_path`` (default ``model.path``) with its own
  gradients and optimizer state: the cost of a separate value model, which the planner counts. Its LM head is
  not used (and not trained when it is not tied to the embeddings). From Python, ``critic.model_path`` may
  instead hold a loaded sequence-classification model with one label (TRL's ``value_model``, given to
  ``slimgrpo.trl``'s ``PPOTrainer``): its decoder is the backbone and its ``score`` head the value head, and
  that object is the one trained (the head in float32).

The value head is a ``Linear(hidden, 1)`` in fp32, initialised to zero (every value starts at 0), read at the
hidden state that predicts each completion token (the state in which that token is chosen), as TRL does.

Under torchrun (docs/distributed.md) the critic is synchronised like the policy, so N ranks with 1/N of the
rows each take the step one process takes with all of them:

- ``ddp``: every rank holds the whole critic; after its backward the critic's gradients are summed over
  ranks (one all-reduce; the value loss is divided by the whole job's token count). The LoRA critic's
  adapter lives in the policy's model, so the policy's DDP wrapper is told to leave it alone
  (``ddp_ignored``) and its initial weights are broadcast from rank 0.
- ``fsdp``, full fine-tuning: the value model (backbone + head) is sharded like the policy, one group per
  decoder layer and a root group, and every critic pass runs through that root's forward.
- ``fsdp``, LoRA: the adapter is sharded with the policy's base and the critic's passes run through the
  policy's root (``attach``); the head stays whole on every rank and its gradient is all-reduced.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from slimgrpo.causal_lm import is_peft, unwrap_causal_lm
from slimgrpo.distributed.context import DistContext
from slimgrpo.loss.objectives import Normaliser, value_loss
from slimgrpo.forward.unpadded import scoring_hidden, unpad_rows
from slimgrpo.modeling import CRITIC_ADAPTER, adapters_in_input_dtype
from slimgrpo.update.batch import BatchTotals, UpdateBatch
from slimgrpo.update.micro import micro_batches
from slimgrpo.update.settings import UpdateSettings


class ValueModel(nn.Module):
    """Backbone and value head as one module: what FSDP2 shards and a distributed checkpoint names
    (``critic.head.*``; the LoRA critic's adapter is saved with the policy's model that holds it). The backbone
    is a causal LM (its decoder is used, never its LM head) or a decoder itself (``get_decoder()`` returns it):
    what a sequence-classification model holds."""

    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.head = head


def _values(vm: ValueModel, ids: torch.Tensor, am: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
    T = comp.shape[1]
    rows, prompt_lengths, _ = unpad_rows(ids, am, T)
    mask = am[:, -T:].bool()
    if bool((prompt_lengths < 1).any()):
        raise ValueError("every row needs at least one prompt token to predict its first completion token")
    # the unpadded layout's hidden states (forward/unpadded.py), without the LM head a value model need not have
    hidden = scoring_hidden(unwrap_causal_lm(vm.backbone), rows, prompt_lengths, T, mask)
    v = vm.head(hidden.float()).squeeze(-1)
    return torch.zeros(mask.shape, dtype=torch.float32, device=v.device).masked_scatter(mask, v)


class Critic:
    """A value function ``V(prefix) -> float`` per completion token: backbone (+ adapter) and value head."""

    def __init__(self, backbone: nn.Module, hidden_size: int, device: torch.device, adapter: str | None = None,
                 dist: DistContext | None = None, head: nn.Linear | None = None):
        """``head``: the value head to train (float32, moved to ``device``); None: a zero one."""
        self.adapter = adapter
        if head is None:
            head = nn.Linear(hidden_size, 1, dtype=torch.float32, device=device)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
        else:
            head = head.to(device=device, dtype=torch.float32)
        self.value_model = ValueModel(backbone, head)
        self.dist = dist or DistContext()
        self.root: nn.Module | None = None  # FSDP2: the sharded root every critic pass runs through
        self.policy_root: nn.Module | None = None  # FSDP2 + LoRA: the policy's root (its base holds the adapter)
        self._trainable = self._backbone_trainable()

    @property
    def backbone(self) -> nn.Module:
        return self.value_model.backbone

    @property
    def head(self) -> nn.Linear:
        return self.value_model.head

    def _run(self, fn, *args):
        """``fn(value_model, *args)``, inside the FSDP2 root's forward when sharded (it gathers the weights)."""
        if self.root is not None:
            return self.root(fn, *args)
        if self.policy_root is not None:
            return self.policy_root(lambda _lm, *a: fn(self.value_model, *a), *args)
        return fn(self.value_model, *args)

    def attach(self, wrapped_policy: nn.Module, strategy: str) -> None:
        """After the policy is wrapped: with FSDP2, a LoRA critic's passes run through the policy's root (the
        adapter's parameters are the sharded ones it now holds)."""
        if self.adapter is not None and strategy == "fsdp" and self.dist.enabled:
            self.policy_root = wrapped_policy
            self._trainable = self._backbone_trainable()

    @property
    def _sharded(self) -> bool:
        return self.root is not None or self.policy_root is not None

    def _backbone_trainable(self) -> list[tuple[str, nn.Parameter]]:
        if self.adapter is not None:  # only the critic's own adapter: the policy's adapter and the base stay out
            return [(n, p) for n, p in self.backbone.named_parameters() if f".{self.adapter}." in n]
        return [(n, p) for n, p in self.backbone.named_parameters() if p.requires_grad]

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer trains for the critic: its adapter (LoRA) or its whole model, and the head."""
        return [p for _, p in self._trainable] + list(self.head.parameters())

    @contextlib.contextmanager
    def active(self) -> Iterator[nn.Module]:
        """The backbone with the critic's adapter switched on (LoRA), the policy's restored afterwards.
        peft's ``set_adapter`` freezes the inactive adapter: gradients of the value loss cannot reach the
        policy's adapter. Both adapters are trainable again afterwards (one optimizer holds both)."""
        if self.adapter is None:
            yield self.backbone
            return
        previous = self.backbone.active_adapter
        self.backbone.set_adapter(self.adapter)
        try:
            yield self.backbone
        finally:
            self.backbone.set_adapter(previous)
            for _, p in self._trainable:
                p.requires_grad_(True)

    def values(self, ids: torch.Tensor, am: torch.Tensor, comp: torch.Tensor) -> torch.Tensor:
        """``[rows, T]`` float32 values of one micro-batch (0 off the completion); call inside ``active``."""
        return self._run(_values, ids, am, comp)

    def batch_values(self, batch: UpdateBatch, settings: UpdateSettings) -> torch.Tensor:
        """``[rows, T]`` values of the whole update batch without gradients (the critic at sampling time), over
        the policy's micro-batches (``micro.micro_batches``)."""
        out = torch.zeros(batch.rows, batch.T, dtype=torch.float32, device=batch.input_ids.device)
        with torch.no_grad(), self.active():
            for micro in micro_batches(batch, settings, self.dist):
                out[micro.rows, micro.columns] = self.values(micro.input_ids, micro.attention_mask,
                                                             micro.completion_ids).to(out.device)
        return out

    def accumulate(self, batch: UpdateBatch, settings: UpdateSettings, totals: BatchTotals, vf_coef: float,
                   cliprange_value: float, loss_scale: float = 1.0) -> dict[str, float]:
        """Forward + backward of ``vf_coef`` x the clipped value loss over the micro-batches of ``batch`` (the
        policy's, ``micro.micro_batches``; gradients summed into ``.grad``). ``totals``: the batch's rows and
        tokens over every rank (``batch.batch_totals``, the policy's normaliser's too): the micro-batch losses
        add up to the token mean of the whole job's batch, so the gradients summed over ranks are one
        process's. ``loss_scale``: a float16 policy's dynamic loss scale (update/loss_scale.py), which the updater
        divides out of every gradient after backward."""
        norm = Normaliser(num_sequences=max(totals.rows, 1), num_tokens=max(totals.tokens, 1))
        scale = float(self.dist.world_size) if self._sharded else 1.0  # FSDP2 averages over ranks
        loss_sum = clip_sum = tokens = 0.0
        with self.active():
            for micro in micro_batches(batch, settings, self.dist):
                v = self.values(micro.input_ids, micro.attention_mask, micro.completion_ids)
                loss, st = value_loss(v, micro.part(batch.old_values), micro.part(batch.returns), micro.loss_mask,
                                      cliprange_value, norm, vf_coef)
                (loss * (scale * loss_scale)).backward()
                loss_sum += st["value/loss"] * st["tokens"]
                clip_sum += st["value/clipfrac"] * st["tokens"]
                tokens += st["tokens"]
        self._sum_gradients_over_ranks(scale)
        return {"value/loss": loss_sum / max(tokens, 1.0), "value/clipfrac": clip_sum / max(tokens, 1.0)}

    def _sum_gradients_over_ranks(self, scale: float) -> None:
        """One all-reduce (sum) of the critic's gradients that no wrapper reduced (every one under DDP; the
        LoRA critic's head under FSDP2, whose sharded adapter FSDP2 reduce-scatters), divided by the loss's
        ``scale``: the gradient one process computes."""
        if not self.dist.enabled:
            return
        from torch.distributed.tensor import DTensor

        params = [p for p in self.parameters() if p.grad is not None and not isinstance(p.grad, DTensor)]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat = self.dist.all_reduce_sum(flat) / scale
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def ddp_ignored(self, policy_model: nn.Module) -> list[str]:
        """Names (in ``policy_model``) of the critic's parameters that live inside the policy's model (the
        LoRA critic's adapter): the policy's DDP wrapper must not synchronise them (the critic does)."""
        mine = {id(p) for _, p in self._trainable}
        return [n for n, p in policy_model.named_parameters() if id(p) in mine]

    def checkpoint_module(self, policy_model: nn.Module) -> nn.Module:
        """The policy and the critic as one module for a distributed checkpoint (``dist_checkpoint``): its
        optimizer holds both. A LoRA critic's adapter is named under ``policy.`` (its model holds it)."""
        return nn.ModuleDict({"policy": policy_model, "critic": self.value_model})

    def gradients(self, batch: UpdateBatch, settings: UpdateSettings, totals: BatchTotals, cfg,
                  loss_scale: float = 1.0) -> dict[str, float]:
        """``accumulate`` with the run's ``critic`` settings: the value loss's gradients next to the policy's."""
        return self.accumulate(batch, settings, totals, cfg.critic.vf_coef, cfg.critic.cliprange_value, loss_scale)

    # --- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The critic's trained tensors (adapter or model, and head), for ``critic.safetensors``."""
        out = {f"backbone.{n}": p.detach().clone().contiguous() for n, p in self._trainable}
        out.update({f"head.{n}": p.detach().clone().contiguous() for n, p in self.head.named_parameters()})
        return out

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        mine = {f"backbone.{n}": p for n, p in self._trainable}
        mine.update({f"head.{n}": p for n, p in self.head.named_parameters()})
        if set(mine) != set(state):
            missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
            raise ValueError(f"the saved critic does not fit this run's critic (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}): keep model, lora and critic settings unchanged")
        for name, p in mine.items():
            p.copy_(state[name].to(p.device, p.dtype))


def build_critic(cfg, policy, dist: DistContext | None = None) -> Critic:
    """The LoRA critic (a second adapter on the policy's base) or, for full fine-tuning, a value model of its
    own; under torchrun made ready for the run's ``distributed.strategy`` (module docstring)."""
    dist = dist or DistContext()
    hidden = unwrap_causal_lm(policy.model).config.get_text_config().hidden_size
    if is_peft(policy.model):
        from peft import LoraConfig as PeftLoraConfig

        lc = cfg.lora
        policy.model.add_adapter(CRITIC_ADAPTER, PeftLoraConfig(
            r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=lc.target_modules,
            task_type="CAUSAL_LM"))
        adapters_in_input_dtype(policy.model)
        policy.model.set_adapter("default")  # the policy's adapter is the active one outside critic passes
        critic = Critic(policy.model, hidden, policy.device, adapter=CRITIC_ADAPTER, dist=dist)
        for p in critic.parameters():
            p.requires_grad_(True)
        _broadcast_from_rank0(critic.parameters(), dist)  # the adapter's random init: rank 0's on every rank
        return critic
    from slimgrpo.config import ModelConfig, resolve_path
    from slimgrpo.modeling import disable_dropout, load_model

    from slimgrpo.config.paths import check_inputs_exist

    sharded = dist.enabled and cfg.distributed.strategy == "fsdp"
    # FSDP2: read into host memory; sharding moves each rank's part to the device (as the policy's)
    device = torch.device("cpu") if sharded else policy.device
    given = _loaded_value_model(cfg.critic.model_path) if isinstance(cfg.critic.model_path, nn.Module) else None
    if given is not None:  # loaded by the caller (module docstring): trained as it is
        if sharded:
            raise ValueError("a loaded value model under distributed.strategy=fsdp is not supported: give "
                             "critic.model_path a model folder (or use distributed.strategy=ddp)")
        model = given.backbone.to(device)
    else:
        check_inputs_exist(cfg, ("critic.model_path",))  # a missing folder: named with its key, not a hub message
        path = resolve_path(cfg, cfg.critic.model_path or cfg.model.path)
        model = load_model(ModelConfig(**{**cfg.model.__dict__, "path": path}), device, policy.dtype)
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is not emb.weight:
        head.requires_grad_(False)  # a value model never reads its LM head
    if cfg.memory.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.model.disable_dropout:
        disable_dropout(model)
    model.train()
    critic_hidden = model.config.get_text_config().hidden_size
    critic = Critic(model, critic_hidden, device, dist=dist, head=None if given is None else given.head)
    if sharded:
        from slimgrpo.distributed.wrap import shard_fsdp

        critic.root = shard_fsdp(model, critic.value_model, cfg)
        critic._trainable = critic._backbone_trainable()  # sharding replaced the parameters by DTensors
    return critic


def _loaded_value_model(model: nn.Module) -> ValueModel:
    """A sequence-classification model with one label as the critic's parts: its decoder (``base_model``) and
    its ``score`` head (``Linear(hidden, 1)``), the modules TRL's PPO reads values from."""
    try:
        head = model.score
    except AttributeError:
        raise ValueError(f"critic.model_path: a loaded {type(model).__name__} has no score head; give a "
                         "sequence-classification model (AutoModelForSequenceClassification, num_labels=1)") from None
    if not isinstance(head, nn.Linear) or head.out_features != 1:
        raise ValueError(f"critic.model_path: the value model's score head must be a Linear(hidden, 1) "
                         f"(num_labels=1), got {head}")
    return ValueModel(model.base_model, head)


def _broadcast_from_rank0(params: list[nn.Parameter], dist: DistContext) -> None:
    with torch.no_grad():
        for p in params:
            dist.broadcast_(p.data)
