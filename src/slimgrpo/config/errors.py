"""The one exception type for bad configuration."""


class ConfigError(ValueError):
    """Bad configuration: unknown key, wrong type, impossible combination."""
