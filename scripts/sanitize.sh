#!/usr/bin/env bash
# The sanitizer pass CI runs after test.sh: builds, in the clang ASan+UBSan tree that
# scripts/fuzz.sh also uses (build-fuzz/, scripts/configure_fuzz_build.sh), the unit tests
# labelled `sanitize` in tests/CMakeLists.txt (parsers, KV pool, scheduler, engine) and the
# fuzz harnesses, then runs them with ctest -L sanitize: any memory error, leak or undefined
# behaviour fails the test that hit it, and every fuzz seed and crash regression is replayed.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
start=$(date +%s)
scripts/configure_fuzz_build.sh morserve_sanitize_targets
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD_DIR" -L sanitize --output-on-failure -j"$JOBS" --timeout 900
echo "sanitize.sh: passed in $(( $(date +%s) - start ))s"
