#!/usr/bin/env bash
# Configures (once) and builds the clang ASan+UBSan+libFuzzer tree that scripts/fuzz.sh and
# scripts/sanitize.sh share: BUILD_DIR (default build-fuzz), CUDA off, -O1 with line tables
# (the usual fuzzing trade: fast enough, readable stacks). Arguments: ninja targets to build.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
scripts/install_deps.sh

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DMORSERVE_FUZZ=ON -DMORSERVE_CUDA=OFF -DMORSERVE_SERVER=ON >/dev/null
fi
cmake --build "$BUILD_DIR" -- -j"$JOBS" "$@"
