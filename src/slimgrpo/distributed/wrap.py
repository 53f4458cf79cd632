"""Multi-process training under torchrun: the DDP / FSDP2 wrappers, generation on FSDP2-sharded weights,
the global gradient norm. (Joining the job: ``distributed/process_group.py``.)

Each rank takes whole prompt groups (``Trainer.next_batch``); the loss divides by whole-batch totals
all-reduced over ranks, and the update multiplies the loss by ``world_size`` because DDP and FSDP2
average gradients (``update.accumulate_gradients``), so N ranks take the same step as one process with
the whole batch.

Memory of ``distributed.strategy=fsdp`` per rank (W ranks, P parameters of b bytes, AdamW in the
parameter dtype keeps 2 states of b bytes each)::

    sharded, always:   (P*b  [weights] + P*b  [gradients] + 2*P*b  [AdamW]) / W
    training forward:  + the root group unsharded, embeddings + LM head (+ final norm) * b, during the
                         backbone forward and the chunked LM head (gathered again in backward);
                         + ~2 decoder layers unsharded (the one running and the next), each with its
                         unsharded gradient before reduce-scatter; + activations as in one process
    generation:        fsdp_generation=gather:    + P*b (the whole model, all-gathered once per step,
                                                          freed when the rollout ends) + the KV cache
                       fsdp_generation=per_layer: + root group + ~1 decoder layer, re-gathered for every
                                                    layer of every generated token (slow) + the KV cache

With ``gather`` a model whose weights fit one device trains even when weights + gradients + AdamW
(4 * P * b) do not: the whole weights are gathered only while sampling, when no activations are alive
and the gradients of the previous step are shards. ``docs/distributed.md`` has the same table.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from slimgrpo.collectives import Collectives
from slimgrpo.config import Config, ConfigError
from slimgrpo.distributed.context import DistContext, ModelForward

log = logging.getLogger("slimgrpo")


# ----------------------------------------------------------------------------- wrappers


def wrap_model(model: nn.Module, cfg: Config, ctx: DistContext, ignore: list[str] | tuple[str, ...] = ()) -> nn.Module:
    """The module the update calls: DDP or an FSDP2-sharded ``ModelForward`` around the causal LM.

    With FSDP2 the causal LM itself is sharded in place (its parameters become DTensors), so every other
    user of ``policy.model`` (generation, checkpoints) must go through the helpers of this module.
    ``ignore`` (DDP): names of parameters of ``model`` that DDP leaves alone (PPO's LoRA critic adapter,
    which its critic synchronises itself)."""
    if cfg.distributed.strategy == "ddp":
        return wrap_ddp(model, ignore)
    return wrap_fsdp(model, cfg)


def wrap_ddp(model: nn.Module, ignore: list[str] | tuple[str, ...] = ()) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = next(model.parameters()).device
    root = ModelForward(model)
    if ignore:  # DDP's own switch for parameters that are synchronised elsewhere
        DDP._set_params_and_buffers_to_ignore_for_model(root, [f"model.{name}" for name in ignore])
    return DDP(
        root,
        device_ids=[device.index] if device.type == "cuda" else None,
        broadcast_buffers=False,  # rotary tables and the like are the same on every rank
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no second copy
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: modules named by ``_no_split_modules`` (transformers)."""
    from slimgrpo.causal_lm import unwrap_causal_lm

    base = unwrap_causal_lm(model)
    names = set(getattr(base, "_no_split_modules", None) or [])
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
        layers = list(getattr(decoder, "layers", []) or [])
    if not layers:
        raise ConfigError(f"distributed.strategy=fsdp: cannot find the decoder layers of {type(base).__name__} "
                          "(no _no_split_modules and no decoder.layers); use distributed.strategy=ddp")
    return layers


def wrap_fsdp(model: nn.Module, cfg: Config) -> nn.Module:
    """FSDP2: one group per decoder layer, the root group (embeddings, final norm, LM head; a tied head
    shares the embedding's parameter inside that group) on a ``ModelForward`` around the model."""
    return shard_fsdp(model, model, cfg)


def shard_fsdp(model: nn.Module, holder: nn.Module, cfg: Config) -> nn.Module:
    """FSDP2 groups for the decoder layers of the causal LM ``model`` and a root group on a ``ModelForward``
    around ``holder`` (``model`` itself, or PPO's value model: backbone + value head); returns the root,
    which every pass calls as ``root(fn, ...)`` to run ``fn(holder, ...)``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from slimgrpo.modeling import resolve_device

    # The model was read into host memory (modeling.build_policy); each fully_shard moves this rank's
    # shards to the mesh's device, one layer at a time.
    device = resolve_device(cfg.run.device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    root = ModelForward(holder)
    # Explicitly True: by default FSDP2 keeps the root group gathered after forward, expecting the backward.
    # A no-grad forward (old log-probs, generation) would then leave it gathered into the next training
    # forward, whose root gradients came out wrong in torch 2.13 (tests/distributed/test_distributed.py catches it).
    fully_shard(root, mesh=mesh, reshard_after_forward=True)
    return root


# ----------------------------------------------------------------------------- generation on sharded weights


def fsdp_modules(root: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered_weights(root: nn.Module) -> Iterator[None]:
    """Inside the root's forward: all-gather every FSDP group once and keep it gathered until exit.

    Layers keep their weights across forwards while inside (``set_reshard_after_forward(False)``), so a
    rollout of T tokens costs one all-gather of the model instead of T per layer. Extra memory: one
    unsharded copy of the weights (P * bytes per parameter) for the duration of the block."""
    children = [m for m in fsdp_modules(root) if m is not root]
    for m in children:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        for m in children:
            m.unshard()
        yield
    finally:
        for m in children:
            m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


class ShardedGenerationEngine:
    """A rollout engine over an FSDP2-sharded model: each ``generate`` runs inside the root's forward.

    Going through the root's forward makes FSDP2 gather the root group (embeddings, LM head) and keeps
    its bookkeeping right (the root must run forward first). ``mode`` says how decoder layers get their
    weights: ``gather`` all-gathers the whole model once per rollout (fast; + one full copy of the
    weights), ``per_layer`` lets each layer's FSDP hook gather and free it on every forward (memory
    ~ one layer; one all-gather per layer per generated token)."""

    def __init__(self, engine, root: nn.Module, mode: str = "gather"):
        self.engine = engine
        self.root = root
        self.mode = mode

    def generate(self, *args, **kwargs):
        def run(_model):
            ctx = gathered_weights(self.root) if self.mode == "gather" else contextlib.nullcontext()
            with ctx:
                return self.engine.generate(*args, **kwargs)

        with torch.no_grad():
            rollout = self.root(run)
        self.root.reshard()  # FSDP2 keeps the root group gathered after forward (it expects a backward)
        return rollout

    def __getattr__(self, name):  # max_batch_rows, parts, ... of the wrapped engine
        return getattr(self.engine, name)


class AgreedGenerationEngine:
    """DDP: each rank generates on its own full model, with no collective, so a failure there (out of
    memory, say) can be shared like a reward failure: every rank stops at once with that rank's message
    (``DistContext.agree``). FSDP2 generation gathers weights, so it cannot be guarded this way."""

    def __init__(self, engine, ctx: DistContext):
        self.engine = engine
        self.ctx = ctx

    def generate(self, *args, **kwargs):
        with self.ctx.agree("generation"):
            return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def generation_agreement(cfg: Config, ctx: DistContext) -> Collectives | None:
    """What a ``TorchRolloutEngine`` of this run agrees over (its ``agree_over``): with FSDP2 and
    ``fsdp_generation=per_layer`` every decoder forward is a collective, so the ranks take the same prompt
    width (the same prefill chunks) and decode until the last of them is done (a rank whose rows all ended
    feeds padding meanwhile); otherwise (one process, DDP, gathered weights) nothing."""
    d = cfg.distributed
    return ctx if ctx.enabled and d.strategy == "fsdp" and d.fsdp_generation == "per_layer" else None


def wrap_engine(engine, wrapped_model: nn.Module, cfg: Config, ctx: DistContext):
    """The rollout engine of a multi-process run: guarded with DDP, on gathered weights with FSDP2.

    A multi-turn agent rollout is wrapped the same way (the trainer hands it here): with DDP a failure on one
    rank, a template error or out of memory, stops every rank; with FSDP2 it runs inside the root's forward on
    gathered weights, so the decoder it drives reads whole weights. The agent keeps no weights of its own: the
    gathered copy is the one the single-turn path makes, alive for one ``generate`` call. Under
    ``fsdp_generation=per_layer`` the engine itself agrees with the other ranks (``generation_agreement``)."""
    if cfg.distributed.strategy == "fsdp":
        return ShardedGenerationEngine(engine, wrapped_model, cfg.distributed.fsdp_generation)
    return AgreedGenerationEngine(engine, ctx)


# ----------------------------------------------------------------------------- gradients


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip to a global gradient norm and return it (the same value on every rank).

    Plain tensors (one process, DDP after the all-reduce) go through ``torch.nn.utils.clip_grad_norm_``.
    FSDP2 gradients are DTensor shards: the norm of each shard is reduced over ranks (``full_tensor``)
    before clipping, so every rank clips by the norm of the whole gradient. Plain gradients beside them
    (PPO's LoRA critic head under FSDP2, the same on every rank) count once."""
    from torch.distributed.tensor import DTensor

    with_grad = [p for p in params if p.grad is not None]
    sharded = [p for p in with_grad if isinstance(p.grad, DTensor)]
    if not sharded:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = torch.nn.utils.get_total_norm([p.grad for p in sharded], norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    plain = [p for p in with_grad if not isinstance(p.grad, DTensor)]
    if plain:
        rest = torch.nn.utils.get_total_norm([p.grad for p in plain], norm_type=2.0)
        total = torch.linalg.vector_norm(torch.stack([total.float(), rest.float().to(total.device)]))
    for group in (sharded, plain):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return float(total)
