"""Run a training job: the process group and the job check (under torchrun), preemption signals, the run read,
admitted and built (``train/trainer.py``'s ``prepare_run``), trained, and the resume hint when it stops early."""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from slimgrpo.config import Config
from slimgrpo.redact import install_log_filter, scrub_text
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs, StopRequest
from slimgrpo.train.trainer import Trainer, prepare_run

log = logging.getLogger("slimgrpo")


def install_preemption_handlers(stop: StopRequest) -> Callable[[], None]:
    """SIGTERM / SIGINT: finish the current step, save a checkpoint, exit 0 (``stop``: the run's stop request,
    which the trainer reads before each step). A second signal stops at once (KeyboardInterrupt; the
    checkpoint being written, if any, is left incomplete and ignored).

    Returns a function that puts the previous handlers back. Outside the main thread (where Python
    cannot install handlers) nothing is installed."""

    def handler(signum, frame):
        if stop.signal is not None:  # second signal: stop now
            raise KeyboardInterrupt
        stop.signal = signal.Signals(signum).name
        stop.requested = True
        log.warning("received %s: finishing this step, then saving a checkpoint (send it again to stop at once)",
                    stop.signal)

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def resume_hint() -> str:
    """The command that resumes this run: the one that started it (secrets scrubbed)."""
    if from_environment().enabled:  # torchrun's own arguments are not in sys.argv
        return "run the same torchrun command again"
    argv = list(sys.argv)
    if argv and (argv[0].endswith("__main__.py") or Path(argv[0]).name == "slimgrpo"):
        argv = ["slimgrpo", *argv[1:]]
    else:
        return "run the same training command again"
    return "run the same command again: " + scrub_text(" ".join(shlex.quote(a) for a in argv))


def run_training(cfg: Config, callbacks=None, train_dataset=None) -> dict[str, Any]:
    install_log_filter(logging.getLogger("slimgrpo"), on_logger=True)  # no secret in our own log lines
    dist_ctx = from_environment()
    if dist_ctx.enabled:
        from slimgrpo.distributed.process_group import check_job, init_process_group

        init_process_group(cfg, dist_ctx)
        check_job(cfg, dist_ctx)  # the same config on every rank, a batch that splits: before any weight loads
    stop = StopRequest()  # made before the build: a signal while the model loads counts too
    restore_handlers = install_preemption_handlers(stop)
    try:
        trainer = Trainer(prepare_run(cfg, RunInputs(dist_ctx, train_dataset=train_dataset, stop=stop)),
                          callbacks=callbacks)
        summary = trainer.train()
    finally:
        restore_handlers()
    if dist_ctx.enabled:  # a finished job: the ranks leave together (a failed one exits as it is)
        from slimgrpo.distributed.process_group import leave_process_group

        leave_process_group(dist_ctx)
    stalled = trainer.watch.stalled is not None  # run.stop_on_stall said why
    early = trainer.watch.early_stopped is not None  # early stopping said why
    if stop.requested and trainer.step_idx < cfg.run.max_steps and dist_ctx.is_main and not stalled and not early:
        signal_name = stop.signal or summary.get("preempted_by")
        why = f"by {signal_name}" if signal_name else "early (a callback asked)"
        complete = ckpt.list_complete(ckpt.checkpoint_dir(trainer.output_dir))
        saved = f"checkpoint saved: {complete[-1]}" if complete else "checkpoint saved"
        log.warning("stopped %s at step %d of %d; %s. To resume, %s (run.resume=auto continues from the "
                    "newest checkpoint).", why, trainer.step_idx, cfg.run.max_steps, saved, resume_hint())
    return summary
