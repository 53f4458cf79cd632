#!/usr/bin/env bash
# Run TRL's own tests/test_grpo_trainer.py offline against TARGET: trl (TRL's GRPOTrainer / GRPOConfig) or slimgrpo
# (the same test file with GRPOTrainer / GRPOConfig bound to slimgrpo.trl's classes). From the repository root:
#
#   benchmarks/trl_tests/run.sh trl                          # the whole file against TRL itself
#   benchmarks/trl_tests/run.sh slimgrpo                     # the same tests, slimgrpo.trl's classes
#   benchmarks/trl_tests/run.sh slimgrpo -k test_train_loss_types   # extra arguments go to pytest
#   benchmarks/trl_tests/run.sh slimgrpo --ids FILE [-v]     # the node ids in FILE (one a line) instead of the file
#
# Results: $RESULTS/TARGET/{junit.xml,summary.json,summary.txt,pytest.log}
# Environment:
#   TRL_TESTS_WORK  where setup.sh put the venv, the TRL test files and the stand-ins (default .bench/trl_tests)
#   VENV            the harness's virtual environment                  (default $TRL_TESTS_WORK/venv)
#   SLIMGRPO_SRC    the slimgrpo src/ folder under test                 (default this checkout's src/)
#   RESULTS         results folder                                      (default $TRL_TESTS_WORK/results)
#   HARNESS_NICE    nice level of the pytest process                    (default 10)
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TARGET="${1:-}"
if [[ "$TARGET" != "trl" && "$TARGET" != "slimgrpo" ]]; then
  echo "usage: $0 trl|slimgrpo [--ids FILE] [pytest args...]" >&2
  exit 2
fi
shift
SELECT=(tests/test_grpo_trainer.py)
if [[ "${1:-}" == "--ids" ]]; then
  [[ -f "${2:-}" ]] || { echo "run.sh: --ids needs a file of node ids" >&2; exit 2; }
  mapfile -t SELECT < <(grep -v '^\s*\(#\|$\)' "$2")
  shift 2
fi
WORK="$(realpath -m "${TRL_TESTS_WORK:-$ROOT/.bench/trl_tests}")"
VENV="${VENV:-$WORK/venv}"
SLIMGRPO_SRC="$(realpath -m "${SLIMGRPO_SRC:-$ROOT/src}")"
TESTS="$WORK/trl_tests"
if [[ ! -f "$TESTS/tests/test_grpo_trainer.py" || ! -f "$WORK/hf_home/standins.json" || ! -x "$VENV/bin/python" ]]; then
  echo "run.sh: set-up missing under $WORK (venv $VENV); run benchmarks/trl_tests/setup.sh first" >&2
  exit 2
fi

OUT="$(realpath -m "${RESULTS:-$WORK/results}")/$TARGET"
mkdir -p "$OUT"
export HF_HOME="$WORK/hf_home"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export HARNESS_TARGET="$TARGET" HARNESS_OUT="$OUT" HARNESS_TESTS="$TESTS"
# The benchmarks package (the plugin, benchmarks.surface) and slimgrpo come from this checkout, nothing installed.
export PYTHONPATH="$ROOT:$SLIMGRPO_SRC"

cd "$TESTS"
nice -n "${HARNESS_NICE:-10}" "$VENV/bin/python" -m pytest -c "$HERE/pytest.ini" --rootdir "$TESTS" \
  "${SELECT[@]}" --junitxml="$OUT/junit.xml" -rfEsxX --durations=30 "$@" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
if [[ -f "$OUT/summary.txt" && $rc -ne 3 ]]; then
  echo
  cat "$OUT/summary.txt"
fi
exit "$rc"
