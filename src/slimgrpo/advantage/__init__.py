"""Advantages as pure functions of the rewards: group-relative (GRPO) with its scalings, RLOO; no model, no torch.distributed."""
