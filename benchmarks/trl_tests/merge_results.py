"""Combine several partial runs of the harness into one table.

    python -m benchmarks.trl_tests.merge_results COLLECT_SUMMARY [RUN_SUMMARY.json | RUN_VERBOSE.log ...] > merged.txt

COLLECT_SUMMARY is a summary.json of a --collect-only run (classification of every test). Each further argument is
either a summary.json (outcomes and messages) or the output of a `run.sh ... -v` run (outcomes only, for a run that
was stopped before it could write its summary). Later arguments win.
"""

import json
import re
import sys
from collections import Counter, defaultdict


def main(argv: list[str]) -> None:
    collect = json.load(open(argv[0]))
    tests = {n: {**t, "outcome": "not run", "message": None, "duration": 0.0, "source": None} for n, t in collect["tests"].items()}
    line_re = re.compile(r"^(tests/\S+::\S+(?:\[.*?\])?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")
    for path in argv[1:]:
        if path.endswith(".json"):
            for n, t in json.load(open(path))["tests"].items():
                if t.get("outcome") not in (None, "not run"):
                    tests[n].update(outcome=t["outcome"], message=t["message"], duration=t["duration"], source=path)
        else:
            for line in open(path, errors="replace"):
                m = line_re.match(line)
                if m:
                    nodeid, outcome = m.groups()
                    outcome = {"XFAIL": "xfailed", "XPASS": "xpassed"}.get(outcome, outcome.lower())
                    if tests[nodeid]["source"] is None or tests[nodeid]["source"].endswith(".log") or tests[nodeid]["source"].endswith(".out"):
                        tests[nodeid].update(outcome=outcome, source=path)

    by_outcome = Counter(t["outcome"] for t in tests.values())
    by_cat = defaultdict(Counter)
    for t in tests.values():
        by_cat[t["primary"]][t["outcome"]] += 1
    print(f"collected {len(tests)}: " + ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
    for cat, counts in sorted(by_cat.items()):
        print(f"  {cat:9s} {sum(counts.values()):4d}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print()
    for n, t in sorted(tests.items()):
        if t["outcome"] not in ("passed", "skipped"):
            print(f"{t['outcome'].upper():8s} [{t['primary']}] {n.split('::', 1)[1]}")
            if t["message"]:
                print(f"         {t['message']}")
    print()
    for n, t in sorted(tests.items()):
        if t["outcome"] == "skipped":
            print(f"SKIPPED  [{t['primary']}] {n.split('::', 1)[1]}  -- {t['message'] or ', '.join(t['reasons'] + t['requires'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
