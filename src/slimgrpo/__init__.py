"""slimgrpo: GRPO-family reinforcement learning for language models, lean in memory and time.

    from slimgrpo import Trainer, load_config
    cfg = load_config("run.yaml", ["loss.beta=0.04"])
    Trainer(cfg, callbacks=[my_callback]).train()
"""

__version__ = "0.1.0"

from slimgrpo import threads as _threads  # noqa: E402

_threads.early_default()  # OpenMP wait policy, before torch loads (see slimgrpo.threads)

from slimgrpo.config import Config, ConfigError, load_config  # noqa: E402
from slimgrpo.train.trainer import Trainer  # noqa: E402

__all__ = ["Config", "ConfigError", "Trainer", "__version__", "load_config"]
