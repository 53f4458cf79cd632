"""slimgrpo's objective against TRL 1.16's own ``GRPOTrainer._compute_loss`` on the same tensors.

TRL's method runs unmodified on a stand-in ``self`` (one process, one micro-batch, no vLLM): its
log-prob/entropy forward is replaced by the test's tensors. Loss values and gradients wrt the log-probs
must agree for every loss type and option slimgrpo takes from TRL. Skipped when trl is not installed.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

from slimgrpo.loss.objectives import LossSettings, Normaliser, TokenEntropy, grpo_loss  # noqa: E402

from _loss_example import ROWS, T  # noqa: E402
from _loss_example import example as _example  # noqa: E402


class _OneProcess:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def _trl_loss(settings: LossSettings, logp, old, ref, adv, mask, entropy, max_len=8):
    cls = trl_grpo.GRPOTrainer
    s = settings
    args = SimpleNamespace(
        use_bias_correction_kl=s.use_bias_correction_kl, delta=s.delta,
        sapo_temperature_pos=s.sapo_temperature_pos, sapo_temperature_neg=s.sapo_temperature_neg,
        vespo_k_pos=s.vespo_k_pos, vespo_lambda_pos=s.vespo_lambda_pos, vespo_k_neg=s.vespo_k_neg,
        vespo_lambda_neg=s.vespo_lambda_neg, steps_per_generation=1, entropy_target=0.2)
    fake = SimpleNamespace(
        args=args, loss_type=s.loss_type, importance_sampling_level=s.importance_sampling_level, beta=s.beta,
        epsilon_low=s.epsilon, epsilon_high=s.upper_epsilon, top_entropy_quantile=s.top_entropy_quantile,
        off_policy_mask_threshold=s.off_policy_mask_threshold, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=max_len, _entropy_bonus_enabled=False,
        use_adaptive_entropy=False, aux_loss_enabled=False, _metrics={"train": defaultdict(list)},
        accelerator=_OneProcess(), get_off_policy_mask=cls.get_off_policy_mask,
        get_gamma_weights=cls.get_gamma_weights)
    fake.get_high_entropy_mask = lambda e, m, q: cls.get_high_entropy_mask(fake, e, m, q)
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    inputs = {"prompt_ids": torch.zeros(ROWS, 1, dtype=torch.long), "prompt_mask": torch.ones(ROWS, 1),
              "completion_ids": torch.zeros(ROWS, T, dtype=torch.long), "completion_mask": mask.float(),
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum().float()}
    return cls._compute_loss(fake, None, inputs)


CASES = {
    "dapo": dict(),
    "grpo_beta": dict(loss_type="grpo", beta=0.1),
    "bnpo_delta": dict(loss_type="bnpo", delta=1.5, epsilon_high=0.28),
    "dr_grpo": dict(loss_type="dr_grpo", max_completion_length=8, beta=0.05),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05, beta=0.1),
    "gspo_dapo_beta": dict(importance_sampling_level="sequence", epsilon=0.05, beta=0.1),
    "no_bias_correction": dict(beta=0.1, use_bias_correction_kl=False),
    "cispo": dict(loss_type="cispo", epsilon_high=1.2, beta=0.05),
    "sapo": dict(loss_type="sapo", beta=0.05),
    "sapo_sequence": dict(loss_type="sapo", importance_sampling_level="sequence"),
    "vespo": dict(loss_type="vespo", beta=0.05),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.05),
    "luspo_token": dict(loss_type="luspo"),
    "off_policy_mask": dict(off_policy_mask_threshold=0.05, beta=0.1),
    "top_entropy": dict(loss_type="grpo", top_entropy_quantile=0.3, beta=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_loss_and_gradient_as_trl(case):
    kw = dict(CASES[case])
    kw.setdefault("max_completion_length", 8)
    s = LossSettings(**kw)
    logp, old, ref, adv, mask, ent = _example()
    ours, _ = grpo_loss(logp, old, ref, adv, mask, s, Normaliser.of(mask), entropy=TokenEntropy(ent))
    (g_ours,) = torch.autograd.grad(ours, logp)
    theirs = _trl_loss(s, logp, old, ref, adv, mask, ent)
    (g_theirs,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_ours * mask, g_theirs * mask, rtol=1e-5, atol=1e-6)


def test_on_policy_same_as_trl():
    """old_per_token_logps absent (one update per batch): TRL uses logp.detach(), as slimgrpo does."""
    s = LossSettings(beta=0.1)
    logp, _, ref, adv, mask, ent = _example(1)
    ours, _ = grpo_loss(logp, None, ref, adv, mask, s, Normaliser.of(mask))
    theirs = _trl_loss(s, logp, None, ref, adv, mask, ent)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(torch.autograd.grad(ours, logp)[0], torch.autograd.grad(theirs, logp)[0])
