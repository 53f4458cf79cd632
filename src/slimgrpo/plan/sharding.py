"""What one rank of an FSDP2 job holds (``distributed.strategy=fsdp`` under torchrun): the plan's lines for
the sharded state divided over the ranks, and the unsharded copies FSDP2 makes while it computes.

FSDP2 (``distributed/wrap.py``) puts each decoder layer in a group of its own and the embeddings, final norm and
LM head in a root group; the weights, gradients and AdamW state of every group are split over the N ranks.
Per rank, then (docs/distributed.md, "Peak memory per rank"):

- weights, trainable adapters, gradients and optimizer state: 1/N each (rounded up);
- during the update: the root group unsharded for the whole forward (the chunked LM head runs inside it)
  and about two decoder layers (the one computing and the one prefetched), plus, for full fine-tuning, one
  layer's unsharded gradient before its reduce-scatter;
- during generation: with ``fsdp_generation=gather`` one whole copy of the weights (every layer gathered
  for the rollout), with ``per_layer`` the root group and one layer.

Pure: no torch. A full-fine-tuning reference copy (host RAM) is not sharded, as in the trainer.
"""

from __future__ import annotations

import dataclasses
import math

from slimgrpo.runspec.cost import Component, num
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape

SHARDED = ("weights", "LoRA adapters", "gradients", "optimizer state", "critic adapter + value head",
           "critic model + value head", "critic gradients", "critic optimizer state", "fp32 master weights",
           "critic fp32 master weights")


def root_group_params(shape: ModelShape) -> int:
    """Embeddings, LM head (once when tied) and final norm: FSDP2's root group."""
    return shape.embedding_params * (1 if shape.tie else 2) + shape.hidden


def shard_components(shape: ModelShape, x: RunSpec, components: list[Component]) -> list[Component]:
    """``components`` as one rank of ``x.fsdp_shards`` holds them (unchanged for 1)."""
    n = x.fsdp_shards
    if n <= 1:
        return components
    out = [dataclasses.replace(c, bytes=math.ceil(c.bytes / n), formula=f"({c.formula}) / {n} ranks")
           if c.name in SHARDED and c.location == "device" else c for c in components]
    b = x.param_dtype_bytes
    root, layer = root_group_params(shape), shape.layer_params
    grad = 0 if x.lora else layer * b
    out.append(Component(
        "FSDP2 unsharded groups", (root + 2 * layer) * b + grad, "update",
        f"root group (embeddings, LM head, final norm) + 2 decoder layers gathered, (R + 2·Lp)·{b} B"
        + (f" + one layer's gradient before its reduce-scatter, Lp·{b} B" if grad else "")
        + f" = ({root:,} + 2·{layer:,})·{b}" + (f" + {layer:,}·{b}" if grad else "")))
    if x.fsdp_generation == "gather":
        out.append(Component("FSDP2 gathered weights", shape.num_params * b, "generation",
                             f"fsdp_generation=gather: one whole copy for the rollout, N·{b} B = "
                             f"{shape.num_params:,}·{b}"))
    else:
        out.append(Component("FSDP2 gathered weights", (root + layer) * b, "generation",
                             f"fsdp_generation=per_layer: root group + one layer, (R + Lp)·{b} B"))
    return out
