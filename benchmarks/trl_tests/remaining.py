"""Print the node ids of a harness summary.json that did not finish (outcome "not run"), for a follow-up run:

    python -m benchmarks.trl_tests.remaining .bench/trl_tests/results/trl/summary.json > ids.txt
    benchmarks/trl_tests/run.sh trl --ids ids.txt
"""

import json
import sys


def main(path: str) -> None:
    summary = json.load(open(path))
    for nodeid, test in sorted(summary["tests"].items()):
        if test["outcome"] in (None, "not run"):
            print(nodeid)


if __name__ == "__main__":
    main(sys.argv[1])
