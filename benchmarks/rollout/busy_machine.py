"""Generation on a machine shared with other CPU-bound processes: thread count and OpenMP wait policy.

    python -m benchmarks.rollout.busy_machine                       # quiet, then 1 competitor, every variant
    python -m benchmarks.rollout.busy_machine --competitors 0 1 --new-tokens 64 --repeats 3

torch's CPU kernels run on an OpenMP team (libgomp in the pip wheels) of ``torch.get_num_threads()``
threads.  Every parallel region ends in a barrier where the threads that finished wait for the others;
libgomp spins there (``GOMP_SPINCOUNT``, 300,000 iterations unless ``OMP_WAIT_POLICY`` says otherwise)
before it sleeps.  When another process holds one of the two cores, the team's second thread is
descheduled for whole scheduler slices while the first one spins at the barrier of each of the
thousands of small regions a decode step runs -- so a step costs scheduler slices rather than
microseconds.  This script measures that mechanism: each variant (threads x wait policy) decodes the
W-cpu model in its own process (``benchmarks.children.decode_threads``: the policy must be in the environment
before torch loads), quiet and next to ``--competitors`` busy-loop processes, alternating variants so that
drifting load hits all.

Variants: ``2/default`` (torch's default), ``2/passive`` (``OMP_WAIT_POLICY=PASSIVE``), ``2/active``
(``OMP_WAIT_POLICY=ACTIVE``), ``2/spin-10k`` and ``2/spin-1k`` (``GOMP_SPINCOUNT``), ``1/default``.  ``import slimgrpo`` before torch picks ``passive`` unless the
user set a policy (``slimgrpo.threads``, ``run.thread_wait_policy``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.harness.machine import start_competitors, stop_competitors
from benchmarks.harness.paths import REPO_ROOT
from benchmarks.harness.processes import child_command, child_env

VARIANTS = {
    "2/default": (2, {}),
    "2/passive": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "2/spin-10k": (2, {"GOMP_SPINCOUNT": "10000"}),
    "2/spin-1k": (2, {"GOMP_SPINCOUNT": "1000"}),
    "2/active": (2, {"OMP_WAIT_POLICY": "ACTIVE"}),
    "1/default": (1, {}),
}


def _run(variant: str, args: argparse.Namespace) -> float | None:
    threads, extra = VARIANTS[variant]
    cmd = child_command("decode_threads", "--rows", args.rows, "--new-tokens", args.new_tokens, "--threads", threads)
    out = subprocess.run(cmd, env=child_env(**extra), cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=args.timeout)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]
    except (IndexError, ValueError, KeyError):
        print(f"{variant} failed: {out.stderr[-500:]}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--competitors", type=int, nargs="+", default=[0, 1], help="busy-loop processes per condition")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args(argv)
    print(f"# busy_machine: W-cpu decode, {a.rows} rows x {a.new_tokens} tokens; cores {os.cpu_count()}, "
          f"loadavg at start {os.getloadavg()}")
    results: dict[tuple[int, str], list[float]] = {}
    for n in a.competitors:
        procs = start_competitors(n)
        try:
            time.sleep(0.5 if n else 0)
            for _ in range(a.repeats):
                for v in a.variants:
                    tok_s = _run(v, a)
                    if tok_s is not None:
                        results.setdefault((n, v), []).append(tok_s)
                    print(f"  competitors={n} {v}: {tok_s and f'{tok_s:.0f}'} tok/s", file=sys.stderr)
        finally:
            stop_competitors(procs)
    head = "| threads / wait policy | " + " | ".join(f"tok/s, {n} competitor(s)" for n in a.competitors)
    if len(a.competitors) > 1:
        head += f" | slowdown {a.competitors[0]} -> {a.competitors[-1]}"
    print(head + " |")
    print("|---|" + "---:|" * (len(a.competitors) + (len(a.competitors) > 1)))
    for v in a.variants:
        med = [statistics.median(results[(n, v)]) if results.get((n, v)) else None for n in a.competitors]
        cells = [f"{m:.0f}" if m else "-" for m in med]
        if len(med) > 1:
            cells.append(f"{med[0] / med[-1]:.1f}x" if med[0] and med[-1] else "-")
        print(f"| {v} | " + " | ".join(cells) + " |")
    print(f"# loadavg at end {os.getloadavg()}; medians of {a.repeats} alternating runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
