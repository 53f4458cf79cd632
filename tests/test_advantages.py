import pytest
import torch

from slimgrpo.advantages import EPS, compute_advantages, grpo_advantages, rloo_advantages, zero_std_fraction

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4


def test_group_scaling_by_hand():
    a = grpo_advantages(REWARDS, 4, "group")
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # 0.57735 (unbiased)
    expected = [(1 - 0.5) / (std + EPS), -0.5 / (std + EPS), -0.5 / (std + EPS), 0.5 / (std + EPS), 0, 0, 0, 0]
    assert torch.allclose(a, torch.tensor(expected), atol=1e-6)


def test_batch_and_no_scaling():
    none = grpo_advantages(REWARDS, 4, "none")
    assert none.tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    batch = grpo_advantages(REWARDS, 4, "batch")
    assert torch.allclose(batch, none / (REWARDS.std() + EPS))


def test_rloo_leave_one_out_by_hand():
    a = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 3.0]), 4)
    # r_i - mean of the other three
    assert torch.allclose(a, torch.tensor([1 - 1.0, 0 - 4 / 3, 0 - 4 / 3, 3 - 1 / 3]))


def test_dispatch_and_errors():
    assert torch.equal(compute_advantages(REWARDS, 4, "rloo"), rloo_advantages(REWARDS, 4))
    with pytest.raises(ValueError, match="groups of 3"):
        grpo_advantages(REWARDS, 3)
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo_advantages(REWARDS, 4, "bogus")


def test_zero_std_fraction():
    assert zero_std_fraction(REWARDS, 4) == 0.5
