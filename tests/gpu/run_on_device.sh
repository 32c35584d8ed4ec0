#!/usr/bin/env bash
# Runs the carried kernel test binaries on a GPU machine, the kernel micro-benchmark
# (kernel_bench, JSON to $OUT), then compute-sanitizer (memcheck on every test, racecheck and
# synccheck on the shared-memory kernels) on subsets that fit the device-time budget. Logs go
# to $OUT (or ./gpu-test-out): one combined log, the gtest XML files in one archive, the
# benchmark JSON, and the benchmark table and a summary printed last.
#   usage: bash .gpu-bin/run_on_device.sh [BIN_DIR]       (default: the script's folder)
set -uo pipefail
bin=${1:-$(cd "$(dirname "$0")" && pwd)}
out=${OUT:-./gpu-test-out}
mkdir -p "$out/xml"
log="$out/gpu-tests.log"
: >"$log"
nvidia-smi -L 2>&1 | tee -a "$log"
summary=()
run() {  # name, command...
  local name=$1
  shift
  echo "=== $name: $*" >>"$log"
  local start=$SECONDS
  "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-60s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
}
for t in "$bin"/kernel_*_test; do
  name=$(basename "$t")
  run "$name" "$t" --gtest_output="xml:$out/xml/$name.xml"
done
run "kernel_bench" "$bin/kernel_bench" "$out/kernel-bench.json"
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
  # The quick attention cases (all code paths: chunks, combine, extra pair, faults, zeros).
  attn='PagedAttentionTest.KvLenZeroRowsGetZeros:PagedAttentionTest.ExtraPairOfRecurrentLayers:PagedAttentionTest.FaultyRowsBecomeNan'
  for t in "$bin"/kernel_*_test; do
    name=$(basename "$t")
    filter='*'
    [ "$name" = kernel_paged_attention_test ] && filter=$attn
    [ "$name" = kernel_gemm_test ] && filter='GemmTest.AlgorithmsAreCachedPerShape'
    run "memcheck $name" "$san" --tool memcheck --error-exitcode 1 "$t" --gtest_filter="$filter"
  done
  run "racecheck attention" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
  run "racecheck sampling" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_sampling_test" --gtest_filter='SamplingTest.MatchesCpuSamplerOnTiedLogits'
  run "synccheck attention" "$san" --tool synccheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
else
  summary+=("compute-sanitizer not found: sanitizer runs skipped")
fi
(cd "$out" && tar czf gtest-xml.tar.gz xml && rm -rf xml)
summary+=("gtest lines: $(grep -c '^\[       OK \]' "$log") OK, $(grep -c '^\[  SKIPPED \] .*(' "$log") skipped, $(grep -c '^\[  FAILED  \] .*(' "$log") failed (sanitizer reruns counted again)")
sed -n '/^=== kernel_bench/,/^===/p' "$log" | grep -v '^==='
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
grep -h -E '^\[  FAILED  \]|ERROR SUMMARY: [1-9]' "$log" | sort -u | head -40
