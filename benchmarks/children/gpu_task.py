"""One task of the GPU suite (benchmarks/gpu/suite.py) in its own process:

    python -m benchmarks.children.gpu_task TASK CTX.json RESULT.json
    python -m benchmarks.children.gpu_task --batch BATCH.json      (--dry-run: [{task, ctx, result, env}, ...])

The driver starts one child per task with a wall-clock limit and kills its process group at that limit,
so a hung kernel, a crash or a CUDA error that poisons the context ends this task and nothing else. The
child writes RESULT.json at start ("running"), after every finished row and at its end; a child killed
midway still leaves its finished rows. It stops itself a few seconds before the driver's limit
(``ctx["seconds"]`` less MARGIN_S), so it normally ends with its rows saved.

TASK is a first-call task (``train``, ``resume``, ``oxen``, ``trl_pair``), the second call's ``qlora_8b``, or a
later section (``loss``, ``planner``, ...): every one is in ``benchmarks/gpu/tasks.py``'s ``TASKS``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

MARGIN_S = 6.0  # the child's own deadline comes this much before the driver's kill


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if argv[0] == "--batch":  # the dry run: every task's setup in one process (one torch import, not six)
        for item in json.loads(Path(argv[1]).read_text()):
            saved = {k: os.environ.get(k) for k in item.get("env", {})}
            os.environ.update(item.get("env", {}))
            try:
                run_task(item["task"], Path(item["ctx"]), Path(item["result"]))
            finally:
                for k, v in saved.items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        return 0
    return run_task(argv[0], Path(argv[1]), Path(argv[2]))


def run_task(task: str, ctx_path: Path, out_path: Path) -> int:
    ctx = json.loads(ctx_path.read_text())
    start = time.monotonic()
    deadline = start + float(ctx["seconds"]) - MARGIN_S
    partial: list[dict] = []
    write_json(out_path, {"status": "running", "rows": partial})

    def on_row(row: dict) -> None:
        partial.append(row)
        write_json(out_path, {"status": "running", "rows": partial})

    try:
        import torch

        from benchmarks.gpu.guard import run_guarded
        from benchmarks.gpu.tasks import TASKS
        from benchmarks.gpu.workloads import settings

        torch.set_num_threads(min(torch.get_num_threads(), 8))
        ctx.update(task=task, work=Path(ctx["work"]), dev=torch.device(ctx["device"]), cfg=settings(ctx["smoke"]),
                   remaining=lambda: deadline - time.monotonic(), on_row=on_row)
        ctx["run"] = lambda label, fn: run_guarded(label, fn, ctx)
        ctx["work"].mkdir(parents=True, exist_ok=True)
        runner = TASKS.get(task)
        if runner is None:
            raise ValueError(f"unknown task {task!r}")
        result = runner(ctx)
        result.setdefault("status", "ok")
    except BaseException as e:  # the report names the failure; the driver goes on with the next task
        result = {"status": f"failed: {type(e).__name__}: {e}"[:500], "rows": partial,
                  "traceback": traceback.format_exc()[-3000:]}
    result["child_s"] = round(time.monotonic() - start, 1)
    write_json(out_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
