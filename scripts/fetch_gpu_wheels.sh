#!/usr/bin/env bash
# Download the wheels benchmarks/gpu/suite.py needs on the GPU machine, which has no package index:
# TRL 1.16 and what its image lacks (datasets, dill, multiprocess), and bitsandbytes (QLoRA, 8-bit AdamW).
# Everything else TRL and slimgrpo import (torch, transformers, peft, accelerate, pyarrow, pandas, xxhash,
# fsspec, huggingface-hub, rich, pyyaml, safetensors) is in that image (docs/benchmarks.md, "GPU suite").
#
#   scripts/fetch_gpu_wheels.sh            # into .whl/ (git-ignored), for Python 3.12 x86-64
#   scripts/fetch_gpu_wheels.sh --no-bnb   # without bitsandbytes (43 MB): TRL only
#   PYVER=3.13 scripts/fetch_gpu_wheels.sh # for another Python on the GPU machine
#
# The device tool carries at most 64 MiB (working tree + carried folders); the set below is ~45 MB.
# gpu_suite.py installs them offline (pip --no-index --no-deps --target) before it runs, each checked
# against that Python's tags first: multiprocess is built for one Python version (py312), and a wheel
# for another version is reported as skipped, not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl  # listed in .gitignore: never committed, carried to the GPU machine with carry=[".whl"]
PIP=${PIP:-/work/venv/bin/pip}
[ -x "$PIP" ] || PIP="python3 -m pip"
WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
[ "${1:-}" = "--no-bnb" ] || WHEELS+=(bitsandbytes==0.50.2)
mkdir -p "$DEST"
PYVER=${PYVER:-3.12}  # the GPU machine's python3 (docs/benchmarks.md#gpu-suite)
$PIP download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${WHEELS[@]}"
ls -l "$DEST"/*.whl | awk '{printf "%8.1f MB  %s\n", $5/1e6, $9}'
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
printf 'total %.1f MiB (limit 64 MiB with the working tree)\n' "$(echo "$total / 1048576" | bc -l)"
[ "$total" -lt $((60 * 1024 * 1024)) ] || { echo "too large for the 64 MiB carry limit" >&2; exit 1; }
