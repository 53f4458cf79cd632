"""The naive LM-head log-probs that the chunked and fused heads are held against (tests, and the loss
benchmarks' baseline: benchmarks/harness/from_tests.py loads this file by its path)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from slimgrpo.loss.chunked_head import _check_inputs, chunked_token_logprobs

# The reference takes exactly the arguments of ``chunked_token_logprobs``, defaults included (bound against
# its signature rather than written out again), so the two contracts cannot drift apart.
_CONTRACT = inspect.signature(chunked_token_logprobs)


def naive_token_logprobs(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """Reference: full ``[N, V]`` logits, ``log_softmax`` and gather.

    Same contract as ``chunked_token_logprobs`` (its signature); its ``token_chunk`` and ``vocab_chunk`` are
    accepted and ignored. The logits are formed in the input dtype (as a model's ``lm_head`` would) and
    then upcast.
    """
    call = _CONTRACT.bind(*args, **kwargs)
    call.apply_defaults()
    a = call.arguments
    hidden, head, targets = a["hidden"], a["head"], a["targets"]
    weight, bias, softcap, logit_scale = head.weight, head.bias, head.softcap, head.logit_scale
    temperature = a["temperature"]
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
    if not (a["return_entropy"] or a["entropy_grad"]):
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, (entropy if a["entropy_grad"] else entropy.detach())


naive_token_logprobs.__signature__ = _CONTRACT  # type: ignore[attr-defined]
