"""The root of the configuration tree: one section per pipeline stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from slimgrpo.config.sections.model import ModelConfig, LoraConfig
from slimgrpo.config.sections.data import DataConfig
from slimgrpo.config.sections.rollout import RolloutConfig
from slimgrpo.config.sections.rewards import RewardsConfig
from slimgrpo.config.sections.critic import CriticConfig
from slimgrpo.config.sections.loss import LossConfig
from slimgrpo.config.sections.memory import MemoryConfig
from slimgrpo.config.sections.optim import OptimConfig
from slimgrpo.config.sections.run import RunConfig, LogConfig, DistributedConfig
from slimgrpo.config.sections.eval import EvalConfig


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (peft)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling completions."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """Reward functions."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The GRPO-family objective and advantages."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """PPO's value function (loss.advantage_estimator=gae)."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Memory tricks and the budget."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run length, batch, seed, checkpoints."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation on held-out prompts during training."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Multi-process training under torchrun (DDP or FSDP2)."""

    # Folder of the YAML file the config came from; relative paths resolve against it.
    base_dir: str = field(default=".", repr=False, metadata={"internal": True})
    # Where each relative path of the config came from (``config/paths.py``: key -> PathOrigin), for messages.
    path_origins: dict = field(default_factory=dict, repr=False, compare=False, metadata={"internal": True})

    @property
    def ppo(self) -> bool:
        """PPO with a learned critic (``loss.advantage_estimator == "gae"``)."""
        return self.loss.advantage_estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        """Reference log-probs are needed: the KL in the loss (beta) or, for PPO, in the reward (kl_coef)."""
        return self.loss.beta > 0 or (self.ppo and self.loss.kl_coef > 0)

    @property
    def needs_old_logp(self) -> bool:
        """Old log-probs are taken before the update: the policy moves before the batch's last pass (several
        iterations or optimizer steps per generation), or PPO (its ratio and KL reward)."""
        return self.loss.num_iterations > 1 or self.loss.steps_per_generation > 1 or self.ppo

    @property
    def prompts_per_step(self) -> int:
        return self.run.batch_size // self.rollout.num_generations

    def to_dict(self) -> dict[str, Any]:
        """Sections as plain dicts. Python objects set from code (reward callables, an in-memory dataset)
        are kept as they are, not copied; ``dump_config`` writes them as names."""
        return _as_dict(self)


def _as_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _as_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.metadata.get("internal")}
    return list(obj) if isinstance(obj, list) else obj
