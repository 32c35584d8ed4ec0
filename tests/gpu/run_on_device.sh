#!/usr/bin/env bash
# Runs the carried kernel test binaries on a GPU machine, the kernel micro-benchmark
# (kernel_bench, JSON to $OUT), then compute-sanitizer (memcheck on every test, racecheck and
# synccheck on the shared-memory kernels) on subsets, each run under a time limit so the
# whole script stays inside one 10-minute device call. Logs go
# to $OUT (or ./gpu-test-out): one combined log, the gtest XML files in one archive, the
# benchmark JSON, and the benchmark table and a summary printed last.
#   usage: bash .gpu-bin/run_on_device.sh [BIN_DIR] [tests|sanitize|all]
#   BIN_DIR defaults to the script's folder; "tests" runs the tests and the benchmark,
#   "sanitize" the compute-sanitizer runs, "all" (the default) both; split them over two
#   device calls when one 10-minute call is too short.
set -uo pipefail
bin=${1:-$(cd "$(dirname "$0")" && pwd)}
part=${2:-all}
# The binaries were linked here against CUDA 13's libcudart / libcublasLt; find them there.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-./gpu-test-out}
mkdir -p "$out/xml"
log="$out/gpu-tests.log"
: >"$log"
nvidia-smi -L 2>&1 | tee -a "$log"
ldd "$bin/kernel_gemm_test" 2>&1 | grep -E 'not found|cuda|cublas' | tee -a "$log"
summary=()
run() {  # limit_s, name, command...   (rc 124: stopped at the limit)
  local limit=$1 name=$2
  shift 2
  echo "=== $name: $*" >>"$log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-60s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
}
for t in "$bin"/kernel_*_test; do
  [ "$part" = sanitize ] && break
  name=$(basename "$t")
  run 240 "$name" "$t" --gtest_output="xml:$out/xml/$name.xml"
done
[ "$part" != sanitize ] && run 120 "kernel_bench" "$bin/kernel_bench" "$out/kernel-bench.json"
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$part" = tests ]; then
  summary+=("sanitizer runs not requested (part=tests)")
elif [ -x "$san" ]; then
  # The quick attention cases (all code paths: chunks, combine, extra pair, faults, zeros).
  attn='PagedAttentionTest.KvLenZeroRowsGetZeros:PagedAttentionTest.ExtraPairOfRecurrentLayers:PagedAttentionTest.FaultyRowsBecomeNan'
  for t in "$bin"/kernel_*_test; do
    name=$(basename "$t")
    filter='*'
    [ "$name" = kernel_paged_attention_test ] && filter=$attn
    [ "$name" = kernel_gemm_test ] && filter='GemmTest.AlgorithmsAreCachedPerShape'
    run 60 "memcheck $name" "$san" --tool memcheck --error-exitcode 1 "$t" --gtest_filter="$filter"
  done
  run 60 "racecheck attention" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
  run 60 "racecheck sampling" "$san" --tool racecheck --error-exitcode 1 \
    "$bin/kernel_sampling_test" --gtest_filter='SamplingTest.MatchesCpuSamplerOnTiedLogits'
  run 60 "synccheck attention" "$san" --tool synccheck --error-exitcode 1 \
    "$bin/kernel_paged_attention_test" --gtest_filter="$attn"
else
  summary+=("compute-sanitizer not found: sanitizer runs skipped")
fi
(cd "$out" && tar czf gtest-xml.tar.gz xml && rm -rf xml)
summary+=("gtest lines: $(grep -c '^\[       OK \]' "$log") OK, $(grep -c '^\[  SKIPPED \] .*(' "$log") skipped, $(grep -c '^\[  FAILED  \] .*(' "$log") failed (sanitizer reruns counted again)")
sed -n '/^=== kernel_bench/,/^===/p' "$log" | grep -v '^==='
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
grep -h -E '^\[  FAILED  \]|ERROR SUMMARY: [1-9]' "$log" | sort -u | head -40
