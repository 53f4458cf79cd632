#!/usr/bin/env bash
# Extract TRL's GRPO test file and the test-support files it imports, at a pinned revision, from a local git
# directory of huggingface/trl (a clone, or a stored snapshot of it). Nothing is vendored into the repository: the
# files are written under $TRL_TESTS_WORK/trl_tests/tests/ at set-up time.
#
#   TRL_TESTS_WORK work folder                       (default: .bench/trl_tests)
#   TRL_GIT_DIR   bare git dir of huggingface/trl   (default: /work/.mirror/huggingface+trl/repo)
#   TRL_TEST_REV  tag / commit to take the tests from (default: v1.9.0, the newest release in the snapshot)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(realpath -m "${TRL_TESTS_WORK:-$HERE/../../.bench/trl_tests}")"
TRL_GIT_DIR="${TRL_GIT_DIR:-/work/.mirror/huggingface+trl/repo}"
TRL_TEST_REV="${TRL_TEST_REV:-v1.9.0}"
DEST="$WORK/trl_tests/tests"

if ! git --git-dir="$TRL_GIT_DIR" rev-parse --verify -q "$TRL_TEST_REV^{commit}" >/dev/null; then
  echo "fetch_tests: revision '$TRL_TEST_REV' not found in $TRL_GIT_DIR" >&2
  echo "fetch_tests: bring the snapshot with the fetch tool (github:huggingface/trl) or set TRL_GIT_DIR" >&2
  exit 2
fi
COMMIT="$(git --git-dir="$TRL_GIT_DIR" rev-parse "$TRL_TEST_REV^{commit}")"
rm -rf "$DEST"
mkdir -p "$DEST"

take() { git --git-dir="$TRL_GIT_DIR" show "$COMMIT:tests/$1" > "$DEST/$1"; }
take __init__.py
take conftest.py
take test_grpo_trainer.py
# Every sibling module the test file (and what it pulls in) imports relatively: `from .name import ...`.
todo=(test_grpo_trainer.py conftest.py)
while ((${#todo[@]})); do
  f="${todo[0]}"; todo=("${todo[@]:1}")
  for mod in $(grep -oE '^from \.[A-Za-z_][A-Za-z0-9_]* import' "$DEST/$f" | awk '{print substr($2,2)}' | sort -u); do
    if [[ ! -f "$DEST/$mod.py" ]]; then take "$mod.py"; todo+=("$mod.py"); fi
  done
done
VERSION_AT_REV="$(git --git-dir="$TRL_GIT_DIR" show "$COMMIT:VERSION" 2>/dev/null || echo unknown)"
cat > "$WORK/trl_tests/REVISION" <<INFO
rev=$TRL_TEST_REV
commit=$COMMIT
trl_version_at_rev=$VERSION_AT_REV
files=$(cd "$DEST" && ls | tr '\n' ' ')
INFO
(cd "$DEST" && sha256sum *.py) > "$WORK/trl_tests/SHA256SUMS"
echo "fetch_tests: tests/ from $TRL_TEST_REV ($COMMIT, VERSION $VERSION_AT_REV): $(cd "$DEST" && ls | tr '\n' ' ')"
