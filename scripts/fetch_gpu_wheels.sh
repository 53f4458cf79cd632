#!/usr/bin/env bash
# Download the wheels benchmarks/gpu/suite.py needs on the lent GPU machine, which has no package index: the
# list is benchmarks/gpu/wheels.py (trl 1.16.0, datasets 5.2.0, dill, multiprocess, torchao 0.18.0,
# bitsandbytes 0.50.2; ~46 MiB), each requirement of each either in the lent image or in the list (that
# module's docstring says which). Then every wheel's size, and the total with the working tree against the
# device tool's 64 MiB.
#
#   scripts/fetch_gpu_wheels.sh            # into .whl/ (git-ignored), for CPython 3.12 x86-64
#   scripts/fetch_gpu_wheels.sh --no-bnb   # without bitsandbytes (41 MiB): TRL and torchao only
#   PYVER=3.13 scripts/fetch_gpu_wheels.sh # for another Python on the GPU machine (the sizes will differ)
#
# The suite installs them offline (pip --no-index --no-deps --target) before it runs, each checked against
# that Python's tags first: multiprocess is built for one Python version (py312), and a wheel for another
# version is reported as skipped, not installed. The device call carries them with carry=[".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl  # listed in .gitignore: never committed
PY=${PY:-python3}
if [ -n "${PIP:-}" ]; then :; elif [ -x /work/venv/bin/pip ]; then PIP=/work/venv/bin/pip; else PIP="$PY -m pip"; fi
NO_BNB=""
[ "${1:-}" = "--no-bnb" ] && NO_BNB=--no-bnb
mapfile -t WHEELS < <($PY -m benchmarks.gpu.wheels pins $NO_BNB)
mkdir -p "$DEST"
PYVER=${PYVER:-3.12}  # the GPU machine's python3 (docs/benchmarks.md#gpu-suite)
$PIP download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
# sizes, the total with the working tree, and a non-zero exit when a wheel is missing, unlisted or too large
$PY -m benchmarks.gpu.wheels check "$DEST" $NO_BNB
