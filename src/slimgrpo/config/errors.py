"""The one exception type for bad configuration."""


class ConfigError(ValueError):
    """Bad configuration: unknown key, wrong type, impossible combination."""


class MemoryBudgetError(ConfigError):
    """The run's memory plan exceeds ``memory.budget`` (or ``memory.host_budget``): exit code 4
    (``slimgrpo.exit_codes``), not 2."""

    exit_code = 4
