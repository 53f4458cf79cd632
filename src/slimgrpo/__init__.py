"""slimgrpo: GRPO-family reinforcement learning for language models, lean in memory and time."""

__version__ = "0.1.0"
