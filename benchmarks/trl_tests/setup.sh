#!/usr/bin/env bash
# Set up the offline harness that runs TRL's own tests/test_grpo_trainer.py (README.md). From the repository root:
#
#   benchmarks/trl_tests/setup.sh                 # venv + pinned packages + TRL test files + stand-ins
#   benchmarks/trl_tests/setup.sh --no-install    # keep the venv as it is; refresh test files and stand-ins only
#
# Everything goes under TRL_TESTS_WORK (default .bench/trl_tests, which git ignores): nothing is written into the
# checkout, and no TRL file enters the repository.
# Environment:
#   TRL_TESTS_WORK  work folder                              (default .bench/trl_tests)
#   VENV            virtual environment to create / use      (default $TRL_TESTS_WORK/venv)
#   TORCH_SPEC      the torch requirement, installed first  (default torch==2.13.0; a CPU wheel, e.g. with
#                   PIP_FIND_LINKS or --index-url https://download.pytorch.org/whl/cpu in PIP_INDEX_URL)
#   TRL_GIT_DIR     git dir of huggingface/trl               (default /work/.mirror/huggingface+trl/repo)
#   TRL_TEST_REV    revision of the test files               (default v1.9.0, see fetch_tests.sh)
#   STANDIN_DTYPE   weight dtype of the stand-in models      (default float32)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="$(realpath -m "${TRL_TESTS_WORK:-$ROOT/.bench/trl_tests}")"
VENV="${VENV:-$WORK/venv}"
INSTALL=1
[[ "${1:-}" == "--no-install" ]] && INSTALL=0
mkdir -p "$WORK"

if ((INSTALL)); then
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  PIP=(nice -n 10 "$VENV/bin/pip" install --disable-pip-version-check -q)
  # torch first and pinned: an unpinned torch pulls a CUDA build.
  "${PIP[@]}" "${TORCH_SPEC:-torch==2.13.0}"
  "${PIP[@]}" -r "$HERE/requirements.txt"
  # slimgrpo's own runtime needs beyond the above (run.sh puts its src/ on PYTHONPATH; it is not installed).
  "${PIP[@]}" "matplotlib>=3.8" "rich>=13" "pyyaml>=6"
  "$VENV/bin/pip" freeze > "$WORK/pip-freeze.txt"
fi

TRL_TESTS_WORK="$WORK" "$HERE/fetch_tests.sh"

# Stand-ins are built with the hub switched off: nothing here downloads.
cd "$ROOT"
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH="$ROOT" nice -n 10 "$VENV/bin/python" \
  -m benchmarks.trl_tests.standins.build_standins --hf-home "$WORK/hf_home" --dtype "${STANDIN_DTYPE:-float32}"
echo "setup: done under $WORK. Run benchmarks/trl_tests/run.sh trl (or slimgrpo)."
