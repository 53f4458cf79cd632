"""TRL's GRPO tests against TRL and against slimgrpo side by side: the counts and the table of the tests that pass
on TRL but not with slimgrpo, each with its class and reason from ``failures.py``.

    python -m benchmarks.trl_tests.compare --trl T1.json [T2.json|run.log ...] --slimgrpo S1.json [S2.json ...]
        [--markdown]

Each ``--trl`` / ``--slimgrpo`` argument is a harness ``summary.json`` (outcomes, messages, the tests' categories)
or the log of a ``run.sh ... -v`` run (outcomes only); later files win for a test they ran. The categories come
from the first summary.json given (a ``--collect-only`` run's has every test). Only ``cpu`` tests (applicable
here) are counted. A failure with no entry in ``failures.py``, or an entry whose test passed, is printed as such:
the table never hides one.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

from benchmarks.trl_tests.failures import CLASSES, FAILURES

_LINE = re.compile(r"^(tests/\S+::\S+?(?:\[.*?\])?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


def merged(paths: list[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """``(categories, outcomes)`` by node id over ``paths`` (later wins)."""
    categories: dict[str, dict] = {}
    outcomes: dict[str, dict] = {}
    for path in paths:
        if path.endswith(".json"):
            summary = json.load(open(path))
            for nodeid, t in summary["tests"].items():
                categories.setdefault(nodeid, t)
                if t.get("outcome") not in (None, "not run"):
                    outcomes[nodeid] = {"outcome": t["outcome"], "message": t.get("message"),
                                        "duration": t.get("duration", 0.0)}
        else:
            for line in open(path, errors="replace"):
                m = _LINE.match(line)
                if m:
                    outcome = {"XFAIL": "xfailed", "XPASS": "xpassed"}.get(m.group(2), m.group(2).lower())
                    outcomes[m.group(1)] = {"outcome": outcome, "message": None, "duration": 0.0}
    return categories, outcomes


def short(nodeid: str) -> str:
    return nodeid.split("::", 1)[1]


def compare(trl_paths: list[str], slim_paths: list[str]) -> dict:
    categories, trl = merged(trl_paths)
    slim_categories, slim = merged(slim_paths)
    for nodeid, t in slim_categories.items():
        categories.setdefault(nodeid, t)
    cpu = sorted(n for n, t in categories.items() if t.get("primary") == "cpu")
    trl_counts = Counter(trl.get(n, {}).get("outcome", "not run") for n in cpu)
    trl_passed = [n for n in cpu if trl.get(n, {}).get("outcome") == "passed"]
    slim_counts = Counter(slim.get(n, {}).get("outcome", "not run") for n in cpu)
    both = [n for n in trl_passed if slim.get(n, {}).get("outcome") == "passed"]
    lost = [n for n in trl_passed if slim.get(n, {}).get("outcome") != "passed"]
    gained = [n for n in cpu if slim.get(n, {}).get("outcome") == "passed" and n not in trl_passed]
    rows = []
    for n in lost:
        kind, reason = FAILURES.get(short(n), ("unexplained", ""))
        rows.append({"test": short(n), "outcome": slim.get(n, {}).get("outcome", "not run"), "class": kind,
                     "reason": reason, "message": (slim.get(n, {}).get("message") or "")[:200]})
    stale = sorted(k for k in FAILURES if not any(short(n) == k for n in lost))
    seconds = sum(slim[n]["duration"] for n in cpu if n in slim)
    return {"applicable": len(cpu), "trl": dict(trl_counts), "trl_passed": len(trl_passed),
            "slimgrpo": dict(slim_counts), "both_passed": len(both), "gained": [short(n) for n in gained],
            "lost": rows, "stale": stale, "by_class": dict(Counter(r["class"] for r in rows)),
            "slimgrpo_test_seconds": round(seconds)}


def render(result: dict, markdown: bool) -> str:
    share = result["both_passed"] / max(result["trl_passed"], 1)
    lines = [f"applicable on this CPU: {result['applicable']}",
             "TRL:      " + ", ".join(f"{k} {v}" for k, v in sorted(result["trl"].items())),
             "slimgrpo: " + ", ".join(f"{k} {v}" for k, v in sorted(result["slimgrpo"].items())),
             f"pass on TRL and with slimgrpo: {result['both_passed']} of {result['trl_passed']} ({share:.0%})",
             "failing with slimgrpo by class: " + ", ".join(f"{CLASSES.get(k, k)} {v}"
                                                            for k, v in sorted(result["by_class"].items())),
             f"pass with slimgrpo, not on TRL: {', '.join(result['gained']) or 'none'}",
             f"slimgrpo's test time (sum of the tests' durations): {result['slimgrpo_test_seconds']} s", ""]
    if markdown:
        lines += ["| test | with slimgrpo | class | reason |", "|---|---|---|---|"]
        lines += [f"| `{r['test']}` | {r['outcome']} | {r['class']} | {r['reason'] or r['message']} |"
                  for r in result["lost"]]
    else:
        for r in result["lost"]:
            lines.append(f"{r['outcome'].upper():8s} [{r['class']}] {r['test']}")
            lines.append(f"         {r['reason'] or r['message']}")
    unexplained = [r["test"] for r in result["lost"] if r["class"] == "unexplained"]
    if unexplained:
        lines += ["", "UNEXPLAINED (no entry in failures.py): " + ", ".join(unexplained)]
    if result["stale"]:
        lines += ["", "entries of failures.py whose test did not fail here (passed, or not run on TRL): "
                  + ", ".join(result["stale"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trl", nargs="+", required=True)
    parser.add_argument("--slimgrpo", nargs="+", required=True)
    parser.add_argument("--markdown", action="store_true", help="the table as markdown (docs/benchmarks.md)")
    parser.add_argument("--json", help="write the comparison here too")
    args = parser.parse_args(argv)
    result = compare(args.trl, args.slimgrpo)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(render(result, args.markdown), end="")


if __name__ == "__main__":
    main()
