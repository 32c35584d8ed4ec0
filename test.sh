#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs every test registered with ctest.
# Environment knobs: BUILD_DIR (default build), MORSERVE_CUDA (AUTO|ON|OFF, default AUTO),
# MORSERVE_SERVER (ON|OFF, default ON), MORSERVE_SANITIZE (address|undefined|thread),
# JOBS (default nproc), CTEST_TIMEOUT (seconds per test without its own TIMEOUT, default 900).
set -euo pipefail
cd "$(dirname "$0")"

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
start=$(date +%s)

scripts/install_deps.sh

cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DMORSERVE_CUDA="${MORSERVE_CUDA:-AUTO}" \
  -DMORSERVE_SERVER="${MORSERVE_SERVER:-ON}" \
  -DMORSERVE_SANITIZE="${MORSERVE_SANITIZE:-}"
cmake --build "$BUILD_DIR" -- -j"$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" --timeout "${CTEST_TIMEOUT:-900}"
# Every docs/...#anchor the tree cites exists; nothing cites notes outside the repository.
scripts/check_doc_links.sh

echo "test.sh: passed in $(( $(date +%s) - start ))s"
