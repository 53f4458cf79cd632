"""``slimgrpo train | plan | eval | report | export | demo``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from slimgrpo import exit_codes

EPILOG_TRAIN = """\
examples:
  slimgrpo train examples/gsm8k.yaml model.path=./my-model run.max_steps=200
  slimgrpo train run.yaml loss.beta=0.04 lora.enabled=true memory.budget=16GiB
  slimgrpo train --help-config            # every key with its default and meaning
  slimgrpo train --trl-config grpo.yaml max_steps=10   # the YAML of TRL's `trl grpo`, as it is
"""


def _parser() -> argparse.ArgumentParser:
    from slimgrpo.exit_codes import help_text

    p = argparse.ArgumentParser(
        prog="slimgrpo",
        description="GRPO-family RL for language models, lean in memory and time. Relative paths in a config "
                    "file are taken from the file's folder; in key=value overrides and --flags, from the working "
                    "directory.",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    t = sub.add_parser("train", help="train a model with GRPO from a YAML config",
                       description="Train a causal LM with GRPO. CONFIG is a YAML file; key=value pairs "
                                   "override it (dotted keys, values read as YAML). Relative paths in CONFIG are "
                                   "taken from its folder, those in key=value from the working directory.",
                       epilog=EPILOG_TRAIN + "\n" + help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", nargs="?", help="YAML config file")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, e.g. loss.beta=0.04")
    t.add_argument("--help-config", action="store_true", help="list every config key and exit")
    t.add_argument("--trl-config", metavar="FILE", help="read FILE as the YAML of TRL's `trl grpo` CLI (GRPOConfig, "
                   "model and script fields) and print how each key maps; key=value then takes TRL keys "
                   "(max_steps=2) or slimgrpo keys (run.seed=1)")
    t.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    pl = sub.add_parser("plan", help="predict peak memory of a run, component by component",
                        description="Predict peak memory before a run. Give a CONFIG (with overrides), "
                                    "or --model SHAPE with options.",
                        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    pl.add_argument("config", nargs="?", help="YAML config file (optional with --model)")
    pl.add_argument("overrides", nargs="*", metavar="key=value")
    pl.add_argument("--model", help="model folder, config.json, or a preset (e.g. qwen2.5-0.5b, llama-3.1-8b)")
    pl.add_argument("--budget", help="memory budget, e.g. 16GiB, 24GB or auto")
    pl.add_argument("--device", choices=["cpu", "cuda"], help="device to plan for (default: config's)")
    pl.add_argument("--presets", action="store_true", help="list the model presets and exit")
    pl.add_argument("--nproc", type=int, default=1, metavar="N",
                    help="plan one rank of a torchrun job of N processes in all (nodes x GPUs per node): its share "
                         "of the batch and, with distributed.strategy=fsdp, 1/N of the weights, gradients and "
                         "optimizer state plus the copies FSDP2 gathers (docs/distributed.md)")
    pl.add_argument("--trace", action="store_true",
                    help="also run one real step of the config at full size on fake tensors (no memory allocated, "
                         "no GPU needed; seconds to minutes) and print the traced live tensor bytes per phase "
                         "beside the plan. The trace cannot see allocator caching/fragmentation, library "
                         "workspaces, kernels allocating outside PyTorch, the CUDA context or the Python/torch "
                         "runtime: it adds the measured CPU runtime, or on cuda the CUDA context plus a 10%% "
                         "allocator margin (docs/memory.md#trace)")
    pl.add_argument("--no-data", action="store_true",
                    help="do not read data.path / eval.data: count every prompt at data.max_prompt_length (a bound "
                         "for any data). By default a CONFIG's prompts are tokenized as `slimgrpo train` reads "
                         "them and the plan counts each at the longest (docs/memory.md#prompt-length)")
    pl.add_argument("--longest", action="store_true",
                    help="instead of the plan: the longest context that fits --budget (or memory.budget), twice: a "
                         "long prompt with the config's completion length, and the config's prompt length with a "
                         "long completion; up to the model's position limit after rope scaling, with memory.fit's "
                         "changes applied where needed (never shorter completions) and, on cuda, the trace's 10%% "
                         "allocator margin left free. With --trace each answer is traced, and 5%% longer when "
                         "that was quick (docs/memory.md#longest)")
    pl.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    e = sub.add_parser("eval", help="accuracy and pass@k of a model on a dataset",
                       description="Evaluate a model (or checkpoint) with reward functions: accuracy "
                                   "(fraction scored >= --threshold by the first function) and pass@k. Relative "
                                   "paths in CONFIG are taken from its folder; in key=value, --model, --compare "
                                   "and --data from the working directory.")
    e.add_argument("config", nargs="?", help="YAML config giving the model (model.path, unless --model), data, "
                   "rewards and sampling (optional)")
    e.add_argument("overrides", nargs="*", metavar="key=value")
    e.add_argument("--model", help="model folder (default: config's model.path)")
    e.add_argument("--compare", help="a second model folder to evaluate side by side")
    e.add_argument("--data", help="prompts file (default: config's data.path)")
    e.add_argument("--rewards", nargs="+", help="reward functions (default: config's rewards.functions)")
    e.add_argument("--num-samples", type=int, default=1, help="completions per prompt (default 1)")
    e.add_argument("--k", type=int, nargs="+", default=[1], help="pass@k values (default 1)")
    e.add_argument("--threshold", type=float, default=1.0, help="score counted as correct (default 1.0)")
    e.add_argument("--limit", type=int, help="evaluate only the first N prompts")
    e.add_argument("--json", dest="json_out", help="write the results as JSON to this file, with the completions "
                   "of the first --json-samples prompts (text, score, each reward)")
    e.add_argument("--json-samples", type=int, default=3, metavar="N",
                   help="with --json: keep every completion of the first N prompts (default 3; 0 = none)")
    e.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    r = sub.add_parser("report", help="plots and an HTML page for a run folder (or several runs overlaid)",
                       description="Write RUN_DIR/report/index.html: status, held-out accuracy, plots, samples and "
                                   "config of a run. With several run folders: one page overlaying them.")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the run's output_dir (several to compare)")
    r.add_argument("--x", choices=["step", "time"], default="step",
                   help="x axis: optimizer step (default) or training time")
    r.add_argument("--out", help="folder for the comparison page (several runs; default ./report-compare)")
    r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    x = sub.add_parser("export", help="merge a LoRA adapter into its base, or copy the adapter alone",
                       description="Export a run's model: SOURCE is a run folder, a checkpoint, or an adapter/model "
                                   "folder. By default a LoRA adapter is merged into its base and saved as one "
                                   "plain Hugging Face folder.")
    x.add_argument("source", help="run folder (uses final/), checkpoint folder, or adapter folder")
    x.add_argument("--out", required=True, help="folder to write (must be new or empty)")
    x.add_argument("--adapter-only", action="store_true", help="save the adapter alone (loads with peft)")
    x.add_argument("--base", help="base model folder (default: the one the adapter names)")
    x.add_argument("--verbose", action="store_true", help="show third-party progress bars and warnings "
                   "(transformers, torch), as log.verbose=true does for train")
    x.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    d = sub.add_parser("demo", help="watch GRPO improve a bundled tiny model on CPU in minutes",
                       description="Train the bundled tiny model on the bundled arithmetic task and print "
                                   "held-out accuracy before and after.")
    d.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    d.add_argument("--output-dir", default=None, help="run folder (default outputs/demo, outputs/demo-tools)")
    d.add_argument("--task", choices=("addition", "tools"), default="addition",
                   help="addition: two-digit sums (default); tools: learn when to call a calculator tool")
    d.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo",
                   help="grpo: group-relative advantages (default); ppo: a learned critic and GAE (addition only)")
    d.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def cmd_train(args) -> int:
    from slimgrpo.commands.train import train_command

    return train_command(args)


def cmd_plan(args) -> int:
    from slimgrpo.commands.plan import plan_command

    return plan_command(args)


def cmd_eval(args) -> int:
    from slimgrpo.commands.eval import eval_command

    return eval_command(args)


def cmd_report(args) -> int:
    from slimgrpo.commands.report import report_command

    return report_command(args)


def cmd_export(args) -> int:
    from slimgrpo.commands.export import export_command
    from slimgrpo.output.console import quiet_third_party

    quiet_third_party(args.verbose)

    return export_command(args)


def cmd_demo(args) -> int:
    if getattr(args, "task", "addition") == "tools":
        if getattr(args, "algorithm", "grpo") != "grpo":
            raise ValueError("--algorithm ppo runs the addition task; the tools demo trains with GRPO")
        from slimgrpo.commands.demo_tools import run_tool_demo

        return run_tool_demo(args.output_dir or "outputs/demo-tools", list(args.overrides))
    from slimgrpo.commands.demo import run_demo

    ppo = getattr(args, "algorithm", "grpo") == "ppo"
    return run_demo(args.output_dir or ("outputs/demo-ppo" if ppo else "outputs/demo"), list(args.overrides),
                    algorithm="ppo" if ppo else "grpo")


def _user_errors() -> tuple[type[BaseException], ...]:
    from slimgrpo.config import ConfigError
    from slimgrpo.data import DataError
    from slimgrpo.modeling import ModelLoadError

    errors: list[type[BaseException]] = [ConfigError, DataError, ModelLoadError]
    try:
        from slimgrpo.rewards.scoring import RewardFunctionError

        errors.append(RewardFunctionError)
    except ImportError:
        pass
    from slimgrpo.distributed.context import CollectiveError, RankFailure
    from slimgrpo.update.optim import OptimizerUnavailable
    errors += [OptimizerUnavailable, RankFailure, CollectiveError, ValueError, FileNotFoundError]
    return tuple(errors)


# Exit codes: one table for every command, slimgrpo/exit_codes.py (README and `slimgrpo --help` show it).
EXIT_DIVERGED = exit_codes.DIVERGED
EXIT_STALLED = exit_codes.STALLED  # run.stop_on_stall: learning stalled (monitor/stall.py)


def _storage_error(e: BaseException) -> str | None:
    """A one-paragraph message for full disks, read-only or forbidden paths; None for other errors."""
    import errno

    if not isinstance(e, OSError) or e.errno is None:
        return None
    fixes = {errno.ENOSPC: "free disk space (or point run.output_dir at a larger disk)",
             errno.EDQUOT: "free space within your disk quota",
             errno.EROFS: "write to a writable folder (run.output_dir=PATH)",
             errno.EACCES: "fix the permissions or choose another path",
             errno.EPERM: "fix the permissions or choose another path",
             errno.EISDIR: "give a file path, not a folder",
             errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path"}
    if e.errno not in fixes:
        return None
    where = f" ({e.filename})" if e.filename else ""
    return (f"{e.strerror or e}{where}: {fixes[e.errno]}. Checkpoints saved before this point are intact; "
            "run the same command again to resume from the newest one.")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (captured in tests)
        pass


def main(argv: list[str] | None = None) -> int:
    rc = _main(argv)
    if argv is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _leave_rank(rc)
    return rc


def _leave_rank(rc: int) -> None:
    """A torchrun rank of the ``slimgrpo`` command ends here, skipping the interpreter's teardown.

    By now the ranks have left the process group together (``distributed.process_group.leave_process_group``) and every
    file of the run is written and closed. What is left for the teardown is C++ destructors of the collective
    backends and of the sharded model, and there a gloo rank of a finished FSDP2 job was seen to abort once
    in CI ("terminate called without an active exception", SIGABRT) after its run printed ``done``: torchrun
    then reports the whole job failed. The ``atexit`` handlers still run (logging's flush among them)."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # key=value after a flag (`plan run.yaml --trace loss.beta=0`): argparse leaves them over
        if not hasattr(args, "overrides") or any(x.startswith("-") or "=" not in x for x in extra):
            parser.parse_args(argv)  # the usual "unrecognized arguments" error, exit 2
        args.overrides = list(args.overrides) + extra
    args.from_command_line = argv is None
    if not args.command:
        parser.print_help()
        return exit_codes.BAD_INPUT
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from slimgrpo.redact import install_log_filter, scrub_text

    install_log_filter()
    handlers = {"train": cmd_train, "plan": cmd_plan, "eval": cmd_eval, "report": cmd_report, "demo": cmd_demo,
                "export": cmd_export}
    from slimgrpo.train.trainer import NonFiniteError

    try:
        rc = handlers[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at interpreter exit
        return rc
    except NonFiniteError as e:  # diverged: an error, never "done"
        if args.debug:
            traceback.print_exc()
        print(f"error: training diverged: {scrub_text(str(e))}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return exit_codes.INTERRUPTED
    except BrokenPipeError:  # the reader went away (``slimgrpo train --help-config | head``): stop quietly
        _silence_stdout()
        return 0
    except Exception as e:  # user-facing errors become one paragraph; --debug shows the traceback
        if args.debug:
            traceback.print_exc()
            inner = getattr(e, "traceback_text", None)  # e.g. a reward function's own traceback
            if inner:
                print(f"\n{inner.rstrip()}", file=sys.stderr)
        storage = _storage_error(e)
        if storage or isinstance(e, _user_errors()):
            print(f"error: {scrub_text(storage or str(e))}", file=sys.stderr)
            if not args.debug:
                print("(run with --debug for the traceback)", file=sys.stderr)
            return getattr(e, "exit_code", exit_codes.BAD_INPUT)  # memory.budget refusing a run: DOES_NOT_FIT
        if not args.debug:
            print(f"internal error: {type(e).__name__}: {scrub_text(str(e))}\n(run with --debug for the traceback; "
                  "please report it)", file=sys.stderr)
        return exit_codes.INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
