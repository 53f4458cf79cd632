"""The small policy-loss example that test_policy_losses.py and test_trl_parity.py share: 5 rows of 7 tokens,
log-probs, old and reference log-probs, advantages, a ragged mask (lengths 7, 3, 5, 1, 4) and entropies."""

from __future__ import annotations

import torch

ROWS, T = 5, 7


def example(seed=0):
    """``(logp, old, ref, advantages, mask, entropy)``; ``logp`` requires grad."""
    g = torch.Generator().manual_seed(seed)
    logp = (-2.0 + 0.5 * torch.randn(ROWS, T, generator=g)).requires_grad_()
    old = logp.detach() + 0.45 * torch.randn(ROWS, T, generator=g)
    ref = logp.detach() + 0.3 * torch.randn(ROWS, T, generator=g)
    advantages = torch.tensor([1.3, -0.7, -0.4, 1.1, 0.0])
    mask = torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 1, 4])[:, None]
    entropy = torch.rand(ROWS, T, generator=g) * 3.0
    return logp, old, ref, advantages, mask, entropy
