"""``slimgrpo train CONFIG [key=value ...]`` (or ``--trl-config``, ``--help-config``): load and check the
config, then run it (``train/runner.py``); the end summary on the console."""

from __future__ import annotations

import os
import textwrap

from slimgrpo import exit_codes


def _help_config() -> None:
    from slimgrpo.config import iter_fields, type_name

    section = None
    for key, tp, default, doc in iter_fields():
        head = key.split(".")[0]
        if head != section:
            section = head
            print(f"\n[{section}]")
        print(f"  {key} = {default!r}   ({type_name(tp)})")
        for line in textwrap.wrap(doc, 96):
            print(f"      {line}")


def train_command(args) -> int:
    from slimgrpo.config import load_config

    if args.help_config:
        _help_config()
        return 0
    if args.trl_config:
        from slimgrpo.trl.yaml import load_trl_config

        overrides = ([args.config] if args.config else []) + list(args.overrides)
        cfg = load_trl_config(args.trl_config, overrides)
        return _train(cfg, args)
    if not args.config:  # a usage error: exit 2 like every other bad input
        from slimgrpo.config import ConfigError

        raise ConfigError("slimgrpo train: give a CONFIG file and/or key=value overrides, e.g. "
                          "slimgrpo train run.yaml run.max_steps=10 (see slimgrpo train --help)")
    overrides = list(args.overrides)
    config = args.config
    if "=" in config and not os.path.exists(config):  # only overrides were given
        overrides.insert(0, config)
        config = None
    cfg = load_config(config, overrides)
    return _train(cfg, args)


def _train(cfg, args) -> int:
    from slimgrpo.config.paths import check_inputs_exist
    from slimgrpo.output.console import print_end_summary, quiet_third_party
    from slimgrpo.train.runner import run_training

    check_inputs_exist(cfg)  # a missing model / data / critic path: named with its key and folder, before any work

    if getattr(args, "from_command_line", False):  # the wait policy must be in place before torch loads
        from slimgrpo import threads

        threads.reexec_for(cfg.run.thread_wait_policy)
    quiet_third_party(cfg.log.verbose)
    summary = run_training(cfg)
    print_end_summary(summary, cfg)  # rank 0 only under torchrun; says "already finished" or "stopped by"
    return exit_codes.STALLED if summary.get("stopped_by") == "stall" else 0  # run.stop_on_stall
