"""The configuration tree: one typed dataclass per pipeline stage.

A config is a YAML file plus dotted ``key=value`` overrides (``loss.beta=0.04``). Every field has a
docstring (the string literal under it), which the docs generator and ``slimgrpo train --help-config``
read. Where TRL's ``GRPOConfig`` has an option with the same meaning we use its name.

Errors in user input raise :class:`ConfigError` with a message that names the key and what to do.

Layout: one module per section (``model``, ``data``, ``rollout``, ``rewards``, ``loss``, ``memory``,
``optim``, ``run``, ``eval``), the root in ``tree``, reading the tree in ``schema``, YAML and overrides in
``parse``, cross-field checks in ``validate``. Everything is re-exported here.
"""

from slimgrpo.config.sections.critic import CriticConfig
from slimgrpo.config.sections.data import DataConfig
from slimgrpo.config.errors import ConfigError
from slimgrpo.config.sections.eval import EvalConfig
from slimgrpo.config.sections.loss import LossConfig, auto_token_chunk
from slimgrpo.config.sections.memory import MemoryConfig
from slimgrpo.config.sections.model import LoraConfig, ModelConfig
from slimgrpo.config.sections.optim import OptimConfig
from slimgrpo.config.parse import (
    all_keys,
    config_to_json,
    dump_config,
    from_dict,
    load_config,
    merge_overrides,
    parse_override,
    read_yaml,
    resolve_path,
    unknown_key_message,
)
from slimgrpo.config.sections.rewards import RewardsConfig
from slimgrpo.config.sections.rollout import RolloutConfig
from slimgrpo.config.sections.run import DistributedConfig, LogConfig, RunConfig
from slimgrpo.config.schema import field_docs, iter_fields, type_name
from slimgrpo.config.tree import Config
from slimgrpo.config.validate import check_context_length, validate_config

__all__ = [
    "Config", "ConfigError", "DataConfig", "DistributedConfig", "EvalConfig", "LogConfig", "LoraConfig", "LossConfig",
    "CriticConfig", "MemoryConfig", "ModelConfig", "OptimConfig", "RewardsConfig", "RolloutConfig", "RunConfig",
    "all_keys", "auto_token_chunk", "check_context_length", "config_to_json", "dump_config", "field_docs",
    "from_dict", "iter_fields", "load_config", "merge_overrides", "parse_override", "read_yaml",
    "resolve_path", "type_name", "unknown_key_message", "validate_config",
]
