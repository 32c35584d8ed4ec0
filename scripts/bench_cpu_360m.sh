#!/usr/bin/env bash
# The CPU protocol of docs/benchmarks.md ("CPU engine at the memory-bandwidth limit"): builds a
# SmolLM2-360M-shaped vanilla model and a MoR-3 model of the same width (middle_cycle,
# 1 + 10 x 3 + 1 layers, a third of the tokens leaving after each loop), then in one session:
# batch-1 decode per weight format against the measured read bandwidth, depth-wise vs
# sequence-wise and MoR vs vanilla at batch 1..32, a 512-token prefill against the measured
# FMA peak, and the int8 accuracy. Writes JSON to OUT (default /tmp/morserve-bench-360m).
# SETS (default "best"): CPU kernel sets to compare side by side, e.g. SETS="avx2 avx512": each
# measurement runs once per set in turn (MORSERVE_CPU_KERNELS), files suffixed with the set.
# Usage: [SETS="avx2 avx512"] scripts/bench_cpu_360m.sh [BUILD_DIR] [OUT]
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-/tmp/morserve-bench-360m}
SETS=${SETS:-best}
M="$BUILD/server/morserve"
# run_sets NAME CMD...: CMD once per set; "{}" in CMD becomes NAME_SET.json under OUT.
run_sets() {
  local name=$1 set
  shift
  for set in $SETS; do
    local want=$set
    [ "$set" = best ] && want=
    MORSERVE_CPU_KERNELS=$want "${@//\{\}/$OUT/${name}_$set.json}"
  done
}
mkdir -p "$OUT"
shape=(--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 32000 --dtype bf16
       --tie-embeddings --max-pos 2048 --layers 32)
[ -d "$OUT/vanilla" ] || "$M" mkmodel --family vanilla "${shape[@]}" --out "$OUT/vanilla"
[ -d "$OUT/mor3" ] || "$M" mkmodel --family mor-ec "${shape[@]}" --recursions 3 --sharing middle_cycle \
  --depth-mix 0.3333333,0.3333333,0.3333334 --out "$OUT/mor3"
lscpu | grep -E "Model name|^Flags" > "$OUT/cpu.txt"
for w in auto int8 f32; do
  run_sets "batch1_$w" "$M" bench --models "$OUT/vanilla" --requests 4 --mean-tokens 48 --std-tokens 0 \
    --prompt-len 4 --batches 1 --modes depth --warmup 2 --repeats 2 --weights "$w" --kv-cache-mb 256 --out {}
done
for b in 1 4 8 16 32; do
  r=$(( b * 3 > 4 ? b * 3 : 4 ))
  run_sets "depth_vs_sequence_b$b" "$M" bench --models "$OUT/vanilla,$OUT/mor3" --requests "$r" \
    --mean-tokens 32 --std-tokens 8 --prompt-len 4 --batches "$b" --modes depth,sequence --warmup 2 \
    --repeats 2 --temperature 1.0 --kv-cache-mb 512 --out {}
done
run_sets prefill512 "$M" bench --models "$OUT/vanilla" --requests 1 --mean-tokens 1 --std-tokens 0 \
  --batches 1 --modes depth --warmup 1 --prefill 512 --repeats 2 --max-step-tokens 512 --kv-cache-mb 256 \
  --out {}
"$BUILD/tests/bench/weight_format_accuracy_bench" "$OUT/vanilla" int8,f16 8 32 > "$OUT/accuracy.json"
for set in $SETS; do
  want=$set
  [ "$set" = best ] && want=
  MORSERVE_CPU_KERNELS=$want "$BUILD/tests/bench/cpu_linear_bench" > "$OUT/cpu_linear_bench_$set.json"
done
echo "wrote $OUT"
