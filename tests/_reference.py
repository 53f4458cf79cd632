"""The naive LM-head log-probs that the chunked and fused heads are held against (tests, and the loss
benchmarks' baseline: benchmarks/bench_loss.py and _gpu_parts.py put this folder on ``sys.path``)."""

from __future__ import annotations

import torch
from torch import Tensor

from slimgrpo.loss.chunked_head import _check_inputs


def naive_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    logit_scale: float = 1.0,
    softcap: float | None = None,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    **chunk_sizes: int | None,
) -> tuple[Tensor, Tensor | None]:
    """Reference: full ``[N, V]`` logits, ``log_softmax`` and gather.

    Same contract as ``chunked_token_logprobs``; its ``token_chunk`` and ``vocab_chunk`` (``chunk_sizes``)
    are accepted and ignored. The logits are formed in the input dtype (as a model's ``lm_head`` would) and
    then upcast.
    """
    del chunk_sizes
    _check_inputs(hidden, weight, targets, bias, temperature, softcap, 1, None)
    logits = torch.nn.functional.linear(hidden, weight, bias).float()  # [N, V]
    # Each transform below allocates another [N, V] tensor, so it is applied only when not a no-op.
    if logit_scale != 1.0:
        logits = logits * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)  # [N, V]
    logp = logp_all.gather(1, targets[:, None]).squeeze(1)  # [N]
    if not (return_entropy or entropy_grad):
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, (entropy if entropy_grad else entropy.detach())
