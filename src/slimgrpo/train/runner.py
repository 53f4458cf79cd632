"""Run a training job: process group (under torchrun), memory plan check, preemption signals."""

from __future__ import annotations

import logging
import signal
from typing import Any

from slimgrpo.config import Config
from slimgrpo.train.distributed import from_environment
from slimgrpo.train.trainer import Trainer

log = logging.getLogger("slimgrpo")


def install_preemption_handlers(trainer: Trainer) -> None:
    """SIGTERM / SIGINT: finish the current step, save a checkpoint, exit 0."""

    def handler(signum, frame):
        if trainer.stop_requested:  # second signal: stop now
            raise KeyboardInterrupt
        trainer.stop_requested = True
        log.warning("received %s: finishing this step, then saving a checkpoint",
                    signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def run_training(cfg: Config, callbacks=None) -> dict[str, Any]:
    dist_ctx = from_environment()
    if dist_ctx.enabled:
        from slimgrpo.train.launch import init_process_group

        init_process_group(cfg, dist_ctx)
    trainer = Trainer(cfg, callbacks=callbacks, dist=dist_ctx)
    install_preemption_handlers(trainer)
    summary = trainer.train()
    if trainer.stop_requested and trainer.step_idx < cfg.run.max_steps:
        log.warning("stopped at step %d; resume with the same command (run.resume=auto)", trainer.step_idx)
    return summary
