"""TRL's front doors into slimgrpo: a TRL script with its import changed, and TRL's YAML.

    from slimgrpo.trl import GRPOConfig, GRPOTrainer     # was: from trl import GRPOConfig, GRPOTrainer
    from slimgrpo.trl import PPOConfig, PPOTrainer       # was: from trl(.experimental.ppo) import ...

- ``configs.py``: TRL's configuration dataclasses (``GRPOConfig``, ``ModelConfig``, ``ScriptArguments``,
  ``GRPOScriptArguments``, ``PPOConfig``) with every field and TRL's defaults, from ``fields.json``;
- ``grpo.py``: ``GRPOTrainer`` on slimgrpo's run; ``ppo.py``: ``PPOTrainer`` (TRL 1.12's, ppo.py's calls) on
  slimgrpo's PPO; ``callbacks.py``: a script's ``TrainerCallback``s on the loop;
- ``model_args.py``: ``get_peft_config``, ``get_quantization_config``, ``get_kbit_device_map`` over ``ModelConfig``;
- ``yaml.py``: ``slimgrpo train --trl-config`` (the YAML of ``trl grpo``); ``rewards.py``: TRL's registry rewards.

What slimgrpo does with each TRL field is the rules table's (``config/trl_table.py``): one table for the script
and the YAML. Nothing here imports ``trl``: TRL need not be installed, and installed beside slimgrpo it is left
alone.
"""

from slimgrpo.config.trl_rules import Refused, Rule
from slimgrpo.config.trl_table import BY_KEY, RULES, hint_for
from slimgrpo.trl.configs import GRPOConfig, GRPOScriptArguments, ModelConfig, PPOConfig, ScriptArguments
from slimgrpo.trl.grpo import GRPOTrainer
from slimgrpo.trl.model_args import get_kbit_device_map, get_peft_config, get_quantization_config
from slimgrpo.trl.ppo import PPOTrainer
from slimgrpo.trl.yaml import Conversion, convert, load_trl_config, render

__all__ = ["BY_KEY", "Conversion", "GRPOConfig", "GRPOScriptArguments", "GRPOTrainer", "ModelConfig", "PPOConfig",
           "PPOTrainer", "RULES", "Refused", "Rule", "ScriptArguments", "convert", "get_kbit_device_map",
           "get_peft_config", "get_quantization_config", "hint_for", "load_trl_config", "render"]
