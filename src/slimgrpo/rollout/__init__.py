"""slimgrpo.rollout: sample completions for a batch of prompts (the generation stage of a GRPO step).

    engine = TorchRolloutEngine(model)                      # the trainer's live model, LoRA or not
    params = SamplingParams(max_new_tokens=256, temperature=1.0, eos_token_ids=(eos,), pad_token_id=pad)
    rollout = engine.generate(prompt_ids, num_generations=8, params=params)   # -> slimgrpo.containers.Rollout
"""

from .engine import RolloutEngine, TorchRolloutEngine
from .sampling import SamplingParams, SamplingWorkspace, sample_next

__all__ = ["RolloutEngine", "SamplingParams", "SamplingWorkspace", "TorchRolloutEngine", "sample_next"]
