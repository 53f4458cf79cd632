"""TRL reward functions that ``trl grpo`` builds with fixed arguments, as plain slimgrpo specs."""

from __future__ import annotations


def soft_overlong_punishment_reward(completion_ids, **kwargs):
    """TRL's ``get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)``, the values
    ``trl grpo`` uses for the registry name ``get_soft_overlong_punishment`` (needs trl installed)."""
    from trl.rewards import get_soft_overlong_punishment

    return get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)(completion_ids, **kwargs)
