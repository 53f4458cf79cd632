"""``slimgrpo report RUN_DIR [RUN_DIR ...]``: the page of one run, or several runs on one page (slimgrpo.report)."""

from __future__ import annotations

from slimgrpo.report import build_comparison, build_report


def report_command(args) -> int:
    """``slimgrpo report``: one run's page in RUN_DIR/report/, or a comparison of several in ``--out``."""
    run_dirs = getattr(args, "run_dirs", None) or [args.run_dir]
    x = getattr(args, "x", "step") or "step"
    if len(run_dirs) > 1:
        page = build_comparison(run_dirs, getattr(args, "out", None), x)
    else:
        if getattr(args, "out", None):
            raise ValueError("--out is for comparing several runs; one run's report goes to RUN_DIR/report/")
        page = build_report(run_dirs[0], x)
    print(page)
    return 0
