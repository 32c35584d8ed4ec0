#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for SECONDS each (default 60), or the named ones:
#   scripts/fuzz.sh [SECONDS] [HARNESS ...]      e.g. scripts/fuzz.sh 1800 jinja bpe
# Builds them first (scripts/configure_fuzz_build.sh: clang, ASan+UBSan, build-fuzz/). Seeds
# come from tests/fuzz/corpus/<name> (read only); what the fuzzer learns goes to
# build-fuzz/fuzz-corpus/<name>, outside git, and is reused by the next run. A crash, leak,
# timeout (> 10 s) or out-of-memory (> 2 GiB) input is written to tests/fuzz/regressions/<name>/
# (commit it with the fix: ctest's fuzz_replay_<name> replays it from then on). Writes a
# summary to build-fuzz/fuzz-summary.json; exits non-zero when any harness found something.
# Knobs: FUZZ_BUILD_DIR, FUZZ_MAX_RUNS (stop a harness after that many executions),
# FUZZ_SUMMARY (the summary file, to run two lists side by side).
set -uo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-60}
shift || true
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
ALL=(safetensors safetensors_index torch_zip unpickler model_config mor_yaml tokenizer_json bpe
     jinja openai_request grpc_request)
HARNESSES=("$@")
[ ${#HARNESSES[@]} -eq 0 ] && HARNESSES=("${ALL[@]}")

targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_$h"); done
scripts/configure_fuzz_build.sh "${targets[@]}" || exit 1

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
failed=()
summary="["
for h in "${HARNESSES[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$h"
  regressions="tests/fuzz/regressions/$h"
  log="$BUILD_DIR/fuzz-$h.log"
  mkdir -p "$work" "$regressions"
  args=(-max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$regressions/")
  [ -n "${FUZZ_MAX_RUNS:-}" ] && args+=(-runs="$FUZZ_MAX_RUNS")
  [ -f "tests/fuzz/dict/$h.dict" ] && args+=(-dict="tests/fuzz/dict/$h.dict")
  start=$(date +%s)
  "$BUILD_DIR/tests/fuzz/fuzz_$h" "${args[@]}" "$work" "tests/fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$work" -type f | wc -l)
  printf 'fuzz %-18s rc=%d %6ss %10s execs  cov %6s  corpus %5s\n' "$h" "$rc" "$secs" \
    "${execs:-?}" "${cov:-?}" "$corpus"
  summary+="$( [ "$summary" = "[" ] || echo ,){\"harness\":\"$h\",\"rc\":$rc,\"seconds\":$secs,"
  summary+="\"executions\":${execs:-0},\"coverage\":${cov:-0},\"corpus\":$corpus}"
  if [ $rc -ne 0 ]; then
    failed+=("$h")
    grep -E "ERROR|SUMMARY|Test unit written|property violated" "$log" | head -8
  fi
done
echo "$summary]" >"${FUZZ_SUMMARY:-$BUILD_DIR/fuzz-summary.json}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in ${failed[*]} (logs: $BUILD_DIR/fuzz-<name>.log; inputs in tests/fuzz/regressions/)"
  exit 1
fi
echo "fuzz.sh: ${#HARNESSES[@]} harnesses, ${SECONDS_EACH}s each, nothing found"
