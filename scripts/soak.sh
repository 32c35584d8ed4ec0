#!/usr/bin/env bash
# The long soak of docs/reliability.md ("Soak and overload"): runs the built
# tests/gateway/gateway_soak_test (the real server and gateway on 127.0.0.1, 10x the server's
# capacity of clients that cancel and disconnect at random points) for SECONDS of load
# (default 180; ctest runs it for 20), then prints its one-line JSON summary: outcome counts,
# server and gateway counters, RSS of the first and last quarter. The full test output goes
# to OUT/soak.log. MORSERVE_SOAK_SEED=N replays a run's request mix.
# Usage: scripts/soak.sh [SECONDS] [BUILD_DIR] [OUT]
set -euo pipefail
SECONDS_OF_LOAD=${1:-180}
BUILD=${2:-build}
OUT=${3:-/tmp/morserve-soak}
BIN="$BUILD/tests/gateway/gateway_soak_test"
if [ ! -x "$BIN" ]; then
  echo "soak.sh: $BIN is not built (ninja -C $BUILD gateway_soak_test)" >&2
  exit 2
fi
mkdir -p "$OUT"
status=0
MORSERVE_SOAK_SECONDS="$SECONDS_OF_LOAD" "$BIN" > "$OUT/soak.log" 2>&1 || status=$?
grep -E '^soak: seed' "$OUT/soak.log" || true
if ! grep -E '^\{"soak":' "$OUT/soak.log"; then
  echo "soak.sh: no summary line; the end of $OUT/soak.log:" >&2
  tail -n 40 "$OUT/soak.log" >&2
fi
if [ "$status" -ne 0 ]; then
  echo "soak.sh: FAILED (exit $status); failures:" >&2
  grep -E -A3 'Failure|FAILED' "$OUT/soak.log" | head -n 60 >&2 || true
else
  echo "soak.sh: passed ($SECONDS_OF_LOAD s of load; log in $OUT/soak.log)"
fi
exit "$status"
