"""Exit codes of every ``slimgrpo`` command: one table, the same meaning in train, plan, eval, report, export
and demo. README.md ("Exit status") and ``slimgrpo --help`` show it; tests/docs/test_docs_blocks.py keeps the
README's table equal to :data:`EXIT_CODES`."""

from __future__ import annotations

OK = 0
INTERNAL_ERROR = 1
BAD_INPUT = 2
DIVERGED = 3
DOES_NOT_FIT = 4
STALLED = 5
INTERRUPTED = 130

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (OK, "done: finished, stopped early because run.best_metric stopped improving (run.early_stopping_patience; "
         "final/ is the best model), already finished (nothing to do), or preempted and checkpointed; plan: fits"),
    (INTERNAL_ERROR, "internal error (a bug: please report it with the --debug output)"),
    (BAD_INPUT, "bad input: config, data, model, reward functions, run folder or disk; the message names it and "
                "what to do"),
    (DIVERGED, "training diverged: non-finite updates or a collapsed policy (run.max_nonfinite_steps, "
               "run.max_collapsed_steps); no final model, the last good checkpoint is kept"),
    (DOES_NOT_FIT, "does not fit: the memory plan exceeds the budget (plan --budget, or train's memory.budget "
                   "without memory.fit, or memory.host_budget); the message lists the changes that would fit"),
    (STALLED, "stopped because learning stalled (run.stop_on_stall); the last checkpoint before the stall is kept"),
    (INTERRUPTED, "interrupted (Ctrl-C, or a second SIGINT/SIGTERM)"),
)


def help_text() -> str:
    """The table as ``slimgrpo --help`` prints it."""
    import textwrap

    return "exit status (every command):\n" + "\n".join(
        textwrap.fill(meaning, 100, initial_indent=f"  {code:<4d}", subsequent_indent=" " * 6)
        for code, meaning in EXIT_CODES)


def markdown_table() -> str:
    """The table as README.md holds it."""
    rows = "\n".join(f"| {code} | {meaning} |" for code, meaning in EXIT_CODES)
    return "| status | meaning |\n|---|---|\n" + rows
