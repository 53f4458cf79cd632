"""Fused LM-head log-probs + loss: one pass per token chunk forms every gradient.

The separate path (``chunked_token_logprobs`` then the objective) runs, per token chunk, the head
product in forward and three more in backward (recompute the logits, ``dL/dh``, ``dL/dW``): the
logits are gone by the time the loss gradient ``g_t = dL/dlogp_t`` is known.  For a *token-separable*
objective -- one whose ``g_t`` depends on ``logp_t`` but on no other token's log-prob -- ``g_t`` can
be formed while the chunk's logits are still at hand, so forward does all the work::

    z = T(h W^T + b)               product 1 (the only one through the head in forward)
    logp, entropy, p = softmax(z)
    g = d objective / d logp       autograd of the objective on a [tokens] tensor (cheap)
    dL/da = g k (onehot - p)       (k = dz/da, see ``chunked_head``)
    dL/dh = dL/da W                product 2   (kept until backward)
    dL/dW += dL/da^T h             product 3   (skipped with a frozen head)

and backward only scales the stored gradients by the upstream gradient of the loss: three head
products instead of four with a trainable head, two with a frozen one.

Which objectives are separable is not assumed from their names.  ``g`` of a chunk is taken from the
objective evaluated on a log-prob vector that holds the true values of the tokens seen so far and a
placeholder (0) elsewhere; once every chunk is done, ``g`` is taken again from the full vector.  If the
two differ (the objective was not separable, e.g. GSPO's sequence ratio with old log-probs), the
difference ``dg`` is applied with a standard chunked backward of ``sum(dg * logp)`` -- gradients are
linear in ``g`` -- so the result is exact either way; a separable objective never pays for it.
The GRPO family at the on-policy point (``num_iterations = 1``, ratio ``exp(logp - sg(logp))``) and
token-level importance sampling with old log-probs are separable; ``fused_applicable`` gates the
cases where the fallback would always run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from slimgrpo.config.sections.loss import auto_token_chunk, fused_applicable  # the path rule, re-exported
from slimgrpo.loss.chunked_head import (
    HeadSpec,
    _backprop_slice,
    _Grads,
    _Head,
    _LogitTransform,
    _SliceSoftmax,
    _vocab_slices,
    _workspace,
    chunked_token_logprobs,
)

FlatObjective = Callable[[Tensor], Tensor]  # logp [n] float32 (with grad) -> scalar loss

# Tolerance of the separability check (relative to the largest |g|): elementwise kernels may differ in
# the last bit between a vectorised body and its tail, which must not trigger the fallback.
_SEPARABLE_RTOL = 1e-6

def _softmax_into(z: Tensor, out: Tensor, want_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """Log-sum-exp, entropy and softmax of logits ``z`` [n, V] (``z`` is left holding ``z - max``).

    The softmax goes to ``out`` (a buffer reused by every chunk: a fresh block of this size costs page
    faults comparable to an elementwise pass), and ``sum_v e_v log e_v`` of the entropy is a row-wise
    dot product of ``e`` with ``z - max`` (a batched matmul, no temporary block).
    Returns (lse [n], entropy [n] or None, p [n, V] = ``out``).
    """
    m = z.amax(dim=1)  # [n]
    z.sub_(m[:, None])
    e = torch.exp(z, out=out)
    s = e.sum(dim=1)
    log_s = s.log()
    entropy = None
    if want_entropy:
        e_log_e = torch.bmm(e[:, None, :], z[:, :, None]).view(-1)  # [n]
        entropy = log_s - e_log_e / s
    return m + log_s, entropy, e.div_(s[:, None])


def _not_separable(g_true: Tensor, g_used: Tensor) -> bool:
    """Whether the per-chunk gradients ``g_used`` [N] differ from the whole vector's ``g_true`` [N] beyond the
    tolerance (the objective was not token-separable): one boolean read from the device.

    A boolean, not two floats compared on the host: ``slimgrpo plan --trace`` runs this on fake tensors, whose
    boolean reads are ``False`` (trace/fake_data.py), so the trace takes the separable path that a run of the
    objectives ``fused_applicable`` admits takes (``_correct`` would add a second chunked pass to the trace only).
    """
    tol = _SEPARABLE_RTOL * g_true.abs().max().clamp_min(1e-30)
    return bool((g_true - g_used).abs().max() > tol)


def _objective_grad(objective: FlatObjective, logp: Tensor) -> Tensor:
    """``d objective / d logp`` at ``logp`` [n] -> [n] float32."""
    with torch.enable_grad():
        x = logp.detach().clone().requires_grad_()
        (g,) = torch.autograd.grad(objective(x), x, allow_unused=True)
    return torch.zeros_like(logp) if g is None else g.float()


@dataclass(frozen=True)
class _FusedPass:
    """The non-tensor arguments of one ``_FusedHeadLoss`` call."""

    objective: FlatObjective
    tf: _LogitTransform
    token_chunk: int
    want_entropy: bool


class _FusedHeadLoss(torch.autograd.Function):
    """See ``fused_token_loss``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, run: _FusedPass):
        objective, tf, token_chunk, want_entropy = run.objective, run.tf, run.token_chunk, run.want_entropy
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        slices = _vocab_slices(vocab, None)
        ws = _workspace(token_chunk, n_tokens, slices, weight)
        f32 = dict(device=hidden.device, dtype=torch.float32)
        scratch = torch.empty(min(token_chunk, max(n_tokens, 1)) * vocab, **f32)  # the softmax, reused
        logp = torch.zeros(n_tokens, **f32)  # [N]; not-yet-seen tokens hold the placeholder 0
        entropy = torch.empty(n_tokens, **f32) if want_entropy else None
        g_used = torch.empty(n_tokens, **f32)
        needs = ctx.needs_input_grad
        grad_hidden = torch.zeros(hidden.shape, **f32) if needs[0] else None  # [N, H]
        grads = _Grads(hidden=None,
                       weight=torch.zeros(weight.shape, **f32) if needs[1] else None,  # [V, H]
                       bias=torch.zeros(vocab, **f32) if (bias is not None and needs[2]) else None)
        head = _Head(weight, bias, tf)
        for s in range(0, n_tokens, token_chunk):
            e = min(s + token_chunk, n_tokens)
            h, y = hidden[s:e], targets[s:e]
            z = ws.logits(h, weight, bias, 0, vocab, tf)  # [n, V] fp32, product 1
            z_y = z.gather(1, y[:, None]).squeeze(1)
            cap = tf.softcap_factor(z)
            lse, ent, p = _softmax_into(z, scratch[: z.numel()].view(z.shape), want_entropy)
            logp[s:e] = z_y - lse
            if entropy is not None:
                entropy[s:e] = ent
            g = _objective_grad(objective, logp)[s:e]
            g_used[s:e] = g
            grads.hidden = None if grad_hidden is None else grad_hidden[s:e]
            _backprop_slice(ws, _SliceSoftmax(p, cap, 0, vocab), h, head, y, g, grads)  # products 2 and 3
        g_true = _objective_grad(objective, logp)
        if n_tokens and _not_separable(g_true, g_used):
            _correct(hidden, head, targets, g_true - g_used, token_chunk, grad_hidden, grads)
        with torch.enable_grad():
            x = logp.detach().clone().requires_grad_()
            loss = objective(x).detach()
        ctx.save_for_backward(*(t if t is not None else torch.empty(0)
                                for t in (grad_hidden, grads.weight, grads.bias)))
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.present = (grad_hidden is not None, grads.weight is not None, grads.bias is not None)
        ctx.mark_non_differentiable(logp)
        if entropy is None:
            return loss, logp, None
        ctx.mark_non_differentiable(entropy)
        return loss, logp, entropy

    @staticmethod
    def backward(ctx, grad_loss, _grad_logp, _grad_entropy):
        saved = ctx.saved_tensors
        out = []
        for t, dtype, present in zip(saved, ctx.dtypes, ctx.present):
            out.append((t * grad_loss.float()).to(dtype) if present else None)
        return out[0], out[1], out[2], None, None


def _correct(hidden: Tensor, head: _Head, targets: Tensor, dg: Tensor, token_chunk: int,
             grad_hidden: Tensor | None, grads: _Grads) -> None:
    """Adds the gradients of ``sum(dg * logp)`` (the non-separable remainder) with the separate path."""
    weight, bias, tf = head.weight, head.bias, head.tf
    leaves = {}
    with torch.enable_grad():
        h = hidden.detach().requires_grad_(grad_hidden is not None)
        w = weight.detach().requires_grad_(grads.weight is not None)
        b = None if bias is None else bias.detach().requires_grad_(grads.bias is not None)
        for name, t in (("h", h), ("w", w), ("b", b)):
            if t is not None and t.requires_grad:
                leaves[name] = t
        if not leaves:
            return
        lp, _ = chunked_token_logprobs(h, HeadSpec(w, b, tf.logit_scale, tf.softcap), targets,
                                       temperature=tf.temperature, token_chunk=token_chunk)
        got = dict(zip(leaves, torch.autograd.grad((lp * dg).sum(), list(leaves.values()))))
    if "h" in got:
        grad_hidden += got["h"].float()
    if "w" in got:
        grads.weight += got["w"].float()
    if "b" in got:
        grads.bias += got["b"].float()


def fused_token_loss(
    hidden: Tensor,
    head: HeadSpec,
    targets: Tensor,
    objective: FlatObjective,
    *,
    temperature: float = 1.0,
    token_chunk: int | None = None,
    return_entropy: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``objective(log p(targets))`` and its gradients in one pass per token chunk.

    Args:
        hidden: ``[N, H]`` final hidden states; head: the LM head (weight ``[V, H]``, bias ``[V]``, logit
            transform) as for ``chunked_token_logprobs``; targets ``[N]`` long.
        objective: maps the ``[N]`` float32 log-probs (a tensor with grad) to a scalar loss; it is
            called once per chunk and twice at the end, so it must be cheap and side-effect free.
        temperature, token_chunk: as for ``chunked_token_logprobs`` (the whole vocabulary is
            processed at once; use the separate path for vocabulary chunks).
        return_entropy: also return the per-token entropy.

    Returns:
        ``(loss, logp [N], entropy [N] or None)``: ``loss`` is a scalar whose backward delivers the
        gradients of ``objective`` to ``hidden``, ``weight`` and ``bias``; ``logp`` and ``entropy``
        carry no gradient.  Gradients equal the separate path's (see the module docstring).
    """
    if token_chunk is None:
        token_chunk = auto_token_chunk(head.weight.shape[0])
    if token_chunk < 1:
        raise ValueError(f"token_chunk must be >= 1, got {token_chunk}")
    tf = _LogitTransform.of(head, temperature)
    return _FusedHeadLoss.apply(hidden, head.weight, head.bias, targets,
                                _FusedPass(objective, tf, token_chunk, return_entropy))


__all__ = ["FlatObjective", "fused_applicable", "fused_token_loss"]
