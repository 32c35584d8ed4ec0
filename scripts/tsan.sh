#!/usr/bin/env bash
# The ThreadSanitizer pass, run by hand (once a session; docs/reliability.md records each run):
#   scripts/tsan.sh [MAIN_BUILD_DIR]     (default build: its test binaries drive the servers)
# Builds build-tsan/ (gcc -fsanitize=thread, CUDA off) and runs under TSan
#   - the engine tests that run threads in process (CPU runner thread pool, scheduler, engine
#     thread, server engine hooks) and the gateway's unit test;
#   - the real `morserve serve` and `morserve-gateway` as the processes under test of the
#     normal build's server and gateway end-to-end tests ($MORSERVE_BIN, $MORSERVE_GATEWAY).
# A report makes a TSan process exit 66 (the tests' Terminate() == 0 checks fail); reports
# also go to build-tsan/tsan-logs/. Uninstrumented Debian libraries (gRPC, Abseil, protobuf)
# are suppressed as server/gateway/tsan_suppressions.txt explains.
set -uo pipefail
cd "$(dirname "$0")/.."

MAIN=${1:-build}
TSAN=${TSAN_BUILD_DIR:-build-tsan}
JOBS=${JOBS:-$(nproc)}
IN_PROCESS=(thread_pool_test engine_test recurrent_engine_test server_engine_hooks_test
            gateway_unit_test)
END_TO_END=(server/server_e2e_test gateway/gateway_e2e_test)

scripts/install_deps.sh
[ -f "$TSAN/build.ninja" ] || cmake -S . -B "$TSAN" -G Ninja -DMORSERVE_SANITIZE=thread \
  -DMORSERVE_CUDA=OFF >/dev/null
cmake --build "$TSAN" -- -j"$JOBS" morserve morserve-gateway "${IN_PROCESS[@]}" || exit 1
cmake --build "$MAIN" -- -j"$JOBS" server_e2e_test gateway_e2e_test || exit 1

logs="$PWD/$TSAN/tsan-logs"
rm -rf "$logs" && mkdir -p "$logs"
export TSAN_OPTIONS="log_path=$logs/tsan suppressions=$PWD/server/gateway/tsan_suppressions.txt"
failed=()
for t in "${IN_PROCESS[@]}"; do
  bin=$(find "$TSAN/tests" -name "$t" -type f -perm -u+x | head -1)
  echo "== $t (TSan)"
  "$bin" --gtest_brief=1 >"$logs/$t.out" 2>&1 || failed+=("$t")
  tail -1 "$logs/$t.out"
done
for t in "${END_TO_END[@]}"; do
  echo "== $t (morserve and morserve-gateway under TSan)"
  MORSERVE_BIN="$PWD/$TSAN/server/morserve" \
    MORSERVE_GATEWAY="$PWD/$TSAN/server/gateway/morserve-gateway" \
    "$MAIN/tests/$t" --gtest_brief=1 >"$logs/$(basename "$t").out" 2>&1 || failed+=("$t")
  tail -1 "$logs/$(basename "$t").out"
done
reports=$(cat "$logs"/tsan.* 2>/dev/null | grep -c "WARNING: ThreadSanitizer" || true)
echo "tsan.sh: ${reports} ThreadSanitizer reports (in $logs); failed: ${failed[*]:-none}"
[ "$reports" -eq 0 ] && [ ${#failed[@]} -eq 0 ]
