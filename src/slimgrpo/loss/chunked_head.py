"""Log-probabilities of chosen tokens through an LM head, without ever holding the full logits.

A policy-gradient loss needs, for every completion token, only ``log p(target)`` (and, for logging,
the entropy).  The naive route materialises ``logits = hidden @ W^T`` of shape ``[N, V]``; with
``V = 151,936`` and ``N = 8 * 4096`` tokens that is 20 GB in fp32, plus as much again for
``log_softmax`` and for its gradient.  Here the head is applied to ``token_chunk`` tokens at a time
(and, optionally, ``vocab_chunk`` vocabulary rows at a time with an online log-sum-exp), only the
per-token log-sum-exp is kept, and backward recomputes each chunk's logits.

Logits of one token (``h`` is ``[H]``, ``W`` is ``[V, H]``, ``b`` is ``[V]``)::

    a = h W^T + b                                   raw head output        [V]
    u = a * logit_scale                             (Cohere, Granite)
    c = softcap * tanh(u / softcap)                 (Gemma 2/3; else c = u)
    z = c / temperature                             tempered logits
    log p(y) = z_y - logsumexp(z)
    entropy  = logsumexp(z) - sum_v softmax(z)_v z_v

Gradient (``g`` is the upstream gradient of ``log p(y)``)::

    dL/dz = g (onehot(y) - softmax(z))
    dL/da = dL/dz * dz/da,  dz/da = logit_scale / temperature * (1 - tanh^2)
                            (the tanh^2 term only with softcap)
    dL/dh = dL/da @ W,   dL/dW = dL/da^T h,   dL/db = sum over tokens of dL/da

Gradients are summed over chunks in fp32 and cast to the input dtype at the end.  The entropy is
returned without gradient (a logged statistic) unless ``entropy_grad`` (the entropy bonus,
``loss.entropy_coef``): then, with ``ge`` its upstream gradient, ``log p = z - logsumexp(z)`` and
``H`` the entropy, ``dH/dz = -p (log p + H)``, so backward forms, per vocabulary slice::

    dL/dz = g onehot(y) - p (g + ge (log p + H))

(``dz/da`` carries the temperature, so w.r.t. the untempered logits this is the familiar
``-(1/T) p (log p + H)``).  Backward then always recomputes the logits (no precomputed
``dlogp/dh`` for a frozen head), so only runs with the bonus pay for it.

Cost in ``[N, H] x [H, V]`` matmuls: with a trainable head, 1 forward + 3 backward (recompute,
``dL/dh``, ``dL/dW``) against the naive path's 1 + 2, so about 4/3 of its time where matmuls
dominate (CPU).  With a frozen head (LoRA) ``dlogp/dh`` is formed during the forward pass from
the logits at hand, so backward recomputes nothing: 2 matmuls, as for the naive path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from slimgrpo.config.sections.loss import auto_token_chunk  # the one default token_chunk (64 MiB blocks)


@dataclass
class HeadSpec:
    """What the chunked head needs to reproduce a model's logits: ``z = T(h W^T + b)``."""

    weight: Tensor  # [V, H] (the input embedding matrix itself when the head is tied)
    bias: Tensor | None = None  # [V] or None
    logit_scale: float = 1.0  # multiplies the head output (Cohere; 1 / logits_scaling for Granite)
    softcap: float | None = None  # final logit soft-capping (Gemma 2/3)


@dataclass(frozen=True)
class _LogitTransform:
    """Maps raw head outputs ``a`` to tempered logits ``z`` (see module docstring)."""

    temperature: float
    logit_scale: float
    softcap: float | None

    @classmethod
    def of(cls, head: HeadSpec, temperature: float) -> _LogitTransform:
        """The transform of ``head`` (its logit scale and softcap) at ``temperature``."""
        return cls(float(temperature), float(head.logit_scale), head.softcap)

    def apply_(self, z: Tensor) -> Tensor:
        """Raw head outputs ``a`` [n, v] float32 -> tempered logits ``z``, in place."""
        if self.logit_scale != 1.0:
            z.mul_(self.logit_scale)
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.temperature != 1.0:
            z.div_(self.temperature)
        return z

    @property
    def linear_factor(self) -> float:
        """dz/da without the softcap term: ``logit_scale / temperature``."""
        return self.logit_scale / self.temperature

    def softcap_factor(self, z: Tensor) -> Tensor | None:
        """The ``1 - tanh^2`` term of dz/da, written through ``z`` [n, v]; None without softcap."""
        if self.softcap is None:
            return None
        tanh = z * (self.temperature / self.softcap)
        return tanh.mul_(tanh).neg_().add_(1.0)


@dataclass(frozen=True)
class _Head:
    """The LM head of one call, as the per-chunk forward passes take it."""

    weight: Tensor  # [V, H]
    bias: Tensor | None  # [V]
    tf: _LogitTransform  # head outputs -> tempered logits


def _vocab_slices(vocab_size: int, vocab_chunk: int | None) -> list[tuple[int, int]]:
    step = vocab_size if vocab_chunk is None else min(vocab_chunk, vocab_size)
    return [(a, min(a + step, vocab_size)) for a in range(0, vocab_size, step)]


class _Workspace:
    """One ``[token_chunk, slice]`` float32 block reused by every chunk (plus one in the input
    dtype when that is not fp32), so that the big per-chunk buffers are allocated once per call:
    on CPU a fresh block of that size costs page faults comparable to an elementwise pass."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device):
        self.block = torch.empty(rows * cols, dtype=torch.float32, device=device)
        self.low = None if dtype == torch.float32 else torch.empty(rows * cols, dtype=dtype,
                                                                   device=device)

    def logits(self, h: Tensor, weight: Tensor, bias: Tensor | None, a: int, b: int,
               tf: _LogitTransform) -> Tensor:
        """Tempered logits of rows ``h`` [n, H] over vocabulary rows ``a:b`` -> [n, b - a] fp32.

        The matmul runs in the input dtype (as the model's own head would) and is then upcast.
        """
        n, v = h.shape[0], b - a
        z = self.block[: n * v].view(n, v)
        raw = z if self.low is None else self.low[: n * v].view(n, v)
        if bias is None:
            torch.mm(h, weight[a:b].T, out=raw)
        else:
            torch.addmm(bias[a:b], h, weight[a:b].T, out=raw)
        if raw is not z:
            z.copy_(raw)
        return tf.apply_(z)

    def in_dtype(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``x`` [n, v] fp32 as ``dtype`` (into the low-precision block, not a new tensor)."""
        if dtype == torch.float32:
            return x
        assert self.low is not None and dtype == self.low.dtype
        return self.low[: x.numel()].view(x.shape).copy_(x)


def _workspace(token_chunk: int, n_tokens: int, slices: list[tuple[int, int]],
               weight: Tensor) -> _Workspace:
    rows = min(token_chunk, max(n_tokens, 1))
    return _Workspace(rows, slices[0][1] - slices[0][0], weight.dtype, weight.device)


def _target_logit(z: Tensor, targets: Tensor, a: int, b: int) -> tuple[Tensor, Tensor]:
    """Picks ``z[i, targets[i] - a]`` from slice ``a:b`` -> (values [n], in_range [n] bool).

    Rows whose target lies outside the slice get an arbitrary value and ``in_range = False``.
    """
    in_range = (targets >= a) & (targets < b)
    local = (targets - a).clamp_(0, b - a - 1)
    return z.gather(1, local[:, None]).squeeze(1), in_range


def _softmax_stats_(
    z: Tensor, want_entropy: bool, keep_exp: bool = False
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Log-sum-exp and entropy of logits ``z`` [n, v], in place.

    With ``m = max_v z``, ``e = exp(z - m)`` and ``s = sum_v e``: ``lse = m + log s`` and
    ``entropy = -sum_v p log p = log s - (1/s) sum_v e log e``, both terms non-negative, which
    keeps precision when the entropy is small next to ``lse``.  ``z`` is left holding ``e`` when
    ``keep_exp`` (else, with the entropy, ``e log e``).  Returns (lse [n], entropy [n] or None,
    s [n]).
    """
    m = z.amax(dim=1)  # [n]
    e = z.sub_(m[:, None]).exp_()
    s = e.sum(dim=1)
    log_s = s.log()
    entropy = None
    if want_entropy:
        e_log_e = torch.special.xlogy(e, e) if keep_exp else e.xlogy_(e)
        entropy = log_s - e_log_e.sum(dim=1) / s
    return m + log_s, entropy, s


def _chunk_forward(
    ws: _Workspace,
    h: Tensor,
    head: _Head,
    targets: Tensor,
    slices: list[tuple[int, int]],
    want_entropy: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Forward statistics of one token chunk.

    Walks the vocabulary slices keeping an online log-sum-exp ``l`` and entropy ``E``.  Merging a
    slice with log-sum-exp ``l_c`` and entropy ``E_c`` (of the softmax within the slice) uses the
    slice weights ``w = e^{l - l'}``, ``w_c = e^{l_c - l'}`` of ``l' = logaddexp(l, l_c)``::

        E' = w (E + l' - l) + w_c (E_c + l' - l_c)        (all terms >= 0)

    Returns (lse [n], target logit [n], entropy [n] or None), all float32.
    """
    lse = entropy = z_target = None
    for a, b in slices:
        z = ws.logits(h, head.weight, head.bias, a, b, head.tf)  # [n, b - a] fp32
        picked, in_range = _target_logit(z, targets, a, b)
        z_target = picked if z_target is None else torch.where(in_range, picked, z_target)
        lse_c, ent_c, _ = _softmax_stats_(z, want_entropy)
        if lse is None:  # first slice
            lse, entropy = lse_c, ent_c
            continue
        new_lse = torch.logaddexp(lse, lse_c)
        if want_entropy:
            entropy = (torch.exp(lse - new_lse) * (entropy + new_lse - lse)
                       + torch.exp(lse_c - new_lse) * (ent_c + new_lse - lse_c))
        lse = new_lse
    return lse, z_target, entropy


@dataclass
class _Grads:
    """fp32 gradient accumulators; None for an input that needs no gradient."""

    hidden: Tensor | None  # [n, H] the current token chunk's rows
    weight: Tensor | None  # [V, H]
    bias: Tensor | None  # [V]


@dataclass(frozen=True)
class _SliceSoftmax:
    """The softmax side of vocabulary slice ``a:b`` of one token chunk, as ``_backprop_slice`` takes it."""

    q: Tensor  # [n, b - a] fp32 the softmax p on this slice (overwritten), or its scaled soft part
    cap: Tensor | None  # [n, b - a] the softcap term 1 - tanh^2, or None without softcap
    a: int
    b: int
    q_scaled: bool = False  # q holds p (g + ge (log p + H)) of the entropy bonus, not p


def _backprop_slice(
    ws: _Workspace,
    sl: _SliceSoftmax,
    h: Tensor,
    head: _Head,
    targets: Tensor,
    g: Tensor,
    grads: _Grads,
) -> None:
    """Adds vocabulary slice ``sl.a:sl.b``'s share of the gradients to ``grads``.

    With ``k = dz/da`` (``k_v = linear_factor * cap_v``) and ``p = softmax(z)``::

        dL/da_iv = g_i k_iv (onehot_iv - p_iv)
        dL/dh_i  = g_i (k_iy W_y - sum_v p_iv k_iv W_v)
        dL/dW_v  = sum_i [y_i = v] k_iv (g_i h_i) - sum_i p_iv k_iv (g_i h_i)
        dL/db_v  = sum_i [y_i = v] k_iv g_i      - sum_i p_iv k_iv g_i

    The upstream gradient scales rows of ``h`` and of ``dL/dh`` (``[n, H]``) instead of the
    ``[n, v]`` block, and the one-hot part is a gather / index-add, so the only full-size work
    is the softmax itself, the optional softcap product and two matmuls.

    ``sl.q`` [n, b - a] fp32 the softmax ``p`` on this slice (overwritten); ``sl.cap`` the softcap
    term ``1 - tanh^2`` [n, b - a] or None; ``h`` [n, H]; ``head`` the weight [V, H] and the logit
    transform; ``g`` [n] fp32 upstream gradient of log p(y).  ``sl.q_scaled``: ``q`` already holds
    the per-element soft part ``p (g + ge (log p + H))`` of the entropy bonus (module docstring)
    instead of ``p``, so it is not scaled by ``g`` again.
    """
    q, cap, a, b, q_scaled = sl.q, sl.cap, sl.a, sl.b, sl.q_scaled
    weight, tf = head.weight, head.tf
    if cap is not None:
        q.mul_(cap)
    g = g * tf.linear_factor  # [n]
    soft = torch.full_like(g, tf.linear_factor) if q_scaled else g  # row scale of the q part
    # One-hot part: k at the target for tokens whose target lies in this slice, 0 for the others
    # (a mask rather than a row selection, which would wait on the device for its size).
    in_range = (targets >= a) & (targets < b)  # [n]
    cols = (targets - a).clamp_(0, b - a - 1)  # [n]
    k_y = in_range.float() if cap is None else cap.gather(1, cols[:, None]).squeeze(1) * in_range
    q_lo = ws.in_dtype(q, weight.dtype)
    w = weight[a:b]  # [b - a, H]
    if grads.hidden is not None:
        if q_scaled:
            grads.hidden += (g * k_y)[:, None] * w[cols].float() - soft[:, None] * (q_lo @ w).float()
        else:
            grads.hidden += g[:, None] * ((k_y[:, None] * w[cols].float()) - (q_lo @ w).float())
    if grads.weight is not None:
        gh = g[:, None] * h.float()  # [n, H]
        sh = soft[:, None] * h.float() if q_scaled else gh
        if weight.dtype == torch.float32:  # in place: no [b - a, H] temporary
            grads.weight[a:b].addmm_(q_lo.T, sh, alpha=-1.0)
        else:  # low-precision matmul (tensor cores), summed in fp32
            grads.weight[a:b] -= (q_lo.T @ sh.to(h.dtype)).float()
        grads.weight.index_add_(0, targets, k_y[:, None] * gh)
    if grads.bias is not None:
        grads.bias[a:b] -= soft @ q
        grads.bias.index_add_(0, targets, k_y * g)


def _chunk_forward_with_hidden_grad(
    ws: _Workspace,
    h: Tensor,
    head: _Head,
    targets: Tensor,
    want_entropy: bool,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Forward of one token chunk over the whole vocabulary, plus ``d logp / d h`` [n, H] fp32.

    Used when the head is frozen: the gradient wrt ``h`` of ``log p(y)`` is formed from the same
    logits, so backward only has to scale it by the upstream gradient.
    """
    weight, tf = head.weight, head.tf
    vocab = weight.shape[0]
    z = ws.logits(h, weight, head.bias, 0, vocab, tf)  # [n, V] fp32
    z_target = z.gather(1, targets[:, None]).squeeze(1)
    cap = tf.softcap_factor(z)  # [n, V] or None
    lse, entropy, s = _softmax_stats_(z, want_entropy, keep_exp=True)
    p = z.div_(s[:, None])
    unit = _Grads(hidden=torch.zeros(h.shape, device=h.device, dtype=torch.float32),
                  weight=None, bias=None)
    _backprop_slice(ws, _SliceSoftmax(p, cap, 0, vocab), h, head, targets, torch.ones_like(lse), unit)
    return lse, z_target, entropy, unit.hidden


@dataclass(frozen=True)
class _Pass:
    """The non-tensor options of one ``_ChunkedHeadLogprob`` call (kept on ``ctx`` for backward)."""

    tf: _LogitTransform
    token_chunk: int
    slices: list[tuple[int, int]]  # the vocabulary slices (``_vocab_slices``)
    want_entropy: bool
    precompute_hidden_grad: bool  # frozen head, one slice, no entropy gradient: dlogp/dh formed in forward
    entropy_grad: bool = False


class _ChunkedHeadLogprob(torch.autograd.Function):
    """Autograd wrapper; see ``chunked_token_logprobs`` for the contract."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, run: _Pass):
        tf, token_chunk, slices, want_entropy = run.tf, run.token_chunk, run.slices, run.want_entropy
        n_tokens = hidden.shape[0]
        ws = _workspace(token_chunk, n_tokens, slices, weight)
        logp = torch.empty(n_tokens, device=hidden.device, dtype=torch.float32)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if want_entropy else None
        # With a frozen head and one vocabulary slice, dlogp/dhidden of each token does not depend
        # on the upstream gradient (it only scales it), so it is formed here while the logits are
        # at hand: backward then needs no recomputation at all.
        unit_grad = torch.empty(hidden.shape, device=hidden.device, dtype=torch.float32) \
            if run.precompute_hidden_grad else None  # [N, H]
        head = _Head(weight, bias, tf)
        for s in range(0, n_tokens, token_chunk):
            e = min(s + token_chunk, n_tokens)
            h, y = hidden[s:e], targets[s:e]
            if unit_grad is None:
                lse_c, z_y, ent_c = _chunk_forward(ws, h, head, y, slices, want_entropy)
            else:
                lse_c, z_y, ent_c, unit_grad[s:e] = _chunk_forward_with_hidden_grad(ws, h, head, y, want_entropy)
            logp[s:e], lse[s:e] = z_y - lse_c, lse_c
            if entropy is not None:
                entropy[s:e] = ent_c
        if unit_grad is not None:
            ctx.save_for_backward(unit_grad)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse,
                                  entropy if run.entropy_grad else None)
        ctx.hidden_dtype = hidden.dtype
        ctx.run = run
        if entropy is None:
            return logp, None
        if not run.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        run = ctx.run
        tf, token_chunk, slices, precomputed = run.tf, run.token_chunk, run.slices, run.precompute_hidden_grad
        needs = ctx.needs_input_grad
        g_all = grad_logp.float()  # [N]
        if precomputed:
            (unit_grad,) = ctx.saved_tensors
            grad_hidden = (unit_grad * g_all[:, None]).to(ctx.hidden_dtype)
            return grad_hidden, None, None, None, None
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        ge_all = None if entropy is None or grad_entropy is None else grad_entropy.float()  # [N]
        ws = _workspace(token_chunk, hidden.shape[0], slices, weight)
        f32 = dict(device=hidden.device, dtype=torch.float32)
        grad_hidden = torch.zeros(hidden.shape, **f32) if needs[0] else None  # [N, H]
        grads = _Grads(hidden=None,
                       weight=torch.zeros(weight.shape, **f32) if needs[1] else None,  # [V, H]
                       bias=torch.zeros(weight.shape[0], **f32) if needs[2] else None)  # [V]
        head = _Head(weight, bias, tf)
        for s in range(0, hidden.shape[0], token_chunk):
            e = min(s + token_chunk, hidden.shape[0])
            h = hidden[s:e]
            grads.hidden = None if grad_hidden is None else grad_hidden[s:e]
            for a, b in slices:
                z = ws.logits(h, weight, bias, a, b, tf)  # recomputed, [n, b - a] fp32
                cap = tf.softcap_factor(z)
                if ge_all is None:
                    p = z.sub_(lse[s:e, None]).exp_()  # softmax of the full vocabulary, on this slice
                    _backprop_slice(ws, _SliceSoftmax(p, cap, a, b), h, head, targets[s:e], g_all[s:e], grads)
                    continue
                q = _entropy_soft_part_(z, lse[s:e], entropy[s:e], g_all[s:e], ge_all[s:e])
                _backprop_slice(ws, _SliceSoftmax(q, cap, a, b, q_scaled=True), h, head, targets[s:e],
                                g_all[s:e], grads)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grads.weight is None else grads.weight.to(weight.dtype),
            None if grads.bias is None else grads.bias.to(bias.dtype),
            None, None,
        )


def _entropy_soft_part_(z: Tensor, lse: Tensor, entropy: Tensor, g: Tensor, ge: Tensor) -> Tensor:
    """``p (g + ge (log p + H))`` [n, v] from tempered logits ``z`` [n, v] (overwritten), with the
    full-vocabulary ``lse``, entropy ``H``, and upstream gradients ``g`` (of log p(y)) and ``ge``
    (of H), all [n]: the softmax part of ``dL/dz`` (module docstring)."""
    logp = z.sub_(lse[:, None])  # log p on this slice
    p = logp.exp()  # one extra [n, v] block, only with the entropy bonus
    return logp.add_(entropy[:, None]).mul_(ge[:, None]).add_(g[:, None]).mul_(p)


def _check_inputs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None,
                  temperature: float, softcap: float | None, token_chunk: int,
                  vocab_chunk: int | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"expected hidden [N, H] and weight [V, H], got {tuple(hidden.shape)} "
                         f"and {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"hidden, weight and bias must share a dtype, got {hidden.dtype}, "
                         f"{weight.dtype} and {None if bias is None else bias.dtype}")
    if targets.shape != hidden.shape[:1] or targets.dtype != torch.long:
        raise ValueError(f"targets must be a long tensor of shape [{hidden.shape[0]}], got "
                         f"{targets.dtype} {tuple(targets.shape)}")
    if targets.numel() and not 0 <= int(targets.min()) <= int(targets.max()) < weight.shape[0]:
        raise ValueError(f"targets must be token ids in [0, {weight.shape[0]}), got values in "
                         f"[{int(targets.min())}, {int(targets.max())}]")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape [{weight.shape[0]}], got {tuple(bias.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 or None, got {softcap}")
    if token_chunk < 1 or (vocab_chunk is not None and vocab_chunk < 1):
        raise ValueError(f"chunk sizes must be >= 1, got token_chunk={token_chunk}, "
                         f"vocab_chunk={vocab_chunk}")


def chunked_token_logprobs(
    hidden: Tensor,
    head: HeadSpec,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
    return_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``log p(targets)`` under ``softmax(z)``, ``z`` as in the module docstring, chunk by chunk.

    Args:
        hidden: ``[N, H]`` final hidden states (fp32 or bf16/fp16).
        head: the LM head: ``weight`` ``[V, H]`` (possibly tied to the input embeddings, possibly
            frozen), ``bias`` ``[V]`` if the model has one, ``logit_scale`` and ``softcap`` (the
            logit transform, module docstring).
        targets: ``[N]`` long, the token whose log-prob is wanted.
        temperature: divides the logits (module docstring).
        token_chunk: tokens per chunk (None: ``auto_token_chunk``); the working set is two or
            three (with softcap) float32 ``[token_chunk, V]`` blocks, e.g. 1.2 GiB for 1024
            tokens and V = 151,936.
        vocab_chunk: vocabulary rows per chunk (None: whole vocabulary at once); the blocks are
            then ``[token_chunk, vocab_chunk]`` (with a frozen head, backward then recomputes the
            logits instead of reusing those of the forward pass).
        return_entropy: also return the entropy of ``softmax(z)`` (without gradient).
        entropy_grad: give that entropy a gradient (the entropy bonus); implies ``return_entropy``.

    Returns:
        ``(logp [N] float32, entropy [N] float32 or None)``.  Peak memory never holds ``[N, V]``.
        Under ``torch.no_grad()`` (or when no input needs grad) nothing is saved for backward.
    """
    weight, bias, softcap = head.weight, head.bias, head.softcap
    if token_chunk is None:
        token_chunk = auto_token_chunk(weight.shape[0], vocab_chunk)
    _check_inputs(hidden, weight, targets, bias, temperature, softcap, token_chunk, vocab_chunk)
    tf = _LogitTransform.of(head, temperature)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not needs_grad:
        return _no_grad_logprobs(hidden, weight, bias, targets, tf, token_chunk, vocab_chunk,
                                 return_entropy or entropy_grad)
    head_frozen = not weight.requires_grad and (bias is None or not bias.requires_grad)
    slices = _vocab_slices(weight.shape[0], vocab_chunk)
    precompute = head_frozen and not entropy_grad and len(slices) == 1
    run = _Pass(tf, token_chunk, slices, return_entropy or entropy_grad, precompute, entropy_grad)
    return _ChunkedHeadLogprob.apply(hidden, weight, bias, targets, run)


@torch.no_grad()
def _no_grad_logprobs(hidden, weight, bias, targets, tf, token_chunk, vocab_chunk, want_entropy):
    """The inference path (reference / old log-probs): chunk by chunk, nothing kept."""
    slices = _vocab_slices(weight.shape[0], vocab_chunk)
    ws = _workspace(token_chunk, hidden.shape[0], slices, weight)
    head = _Head(weight, bias, tf)
    logp, entropy = [], []
    for s in range(0, hidden.shape[0], token_chunk):
        e = min(s + token_chunk, hidden.shape[0])
        lse, z_y, ent = _chunk_forward(ws, hidden[s:e], head, targets[s:e], slices, want_entropy)
        logp.append(z_y - lse)
        if ent is not None:
            entropy.append(ent)
    if not logp:  # no tokens at all
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if want_entropy else None)
    return torch.cat(logp), (torch.cat(entropy) if want_entropy else None)
