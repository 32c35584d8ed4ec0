#!/usr/bin/env bash
# --weights w8a8 (int8 weights, int8 activations per group of 32, VNNI) beside the other CPU
# weight formats on the SmolLM2-360M shape of scripts/bench_cpu_360m.sh: batch-1 decode against
# the read bandwidth, batch 8 and 32 (vanilla and MoR-3, depth-wise and sequence-wise), a
# 512-token prefill, the accuracy against the bf16 checkpoint, and the kernels alone. Every
# measurement runs once per format in turn, so each format's figures sit beside the others'.
#
#   docs/bench/w8a8-2026-11-27-xeon/run.sh BUILD_DIR [OUT_DIR] [MODELS_DIR]
#   (MODELS_DIR holds vanilla/ and mor3/, the models of scripts/bench_cpu_360m.sh, written here
#   when missing; FORMATS overrides the list, default "auto int8 w8a8" plus amx-bf16 where the
#   host has AMX)
set -euo pipefail
BUILD=$1
OUT=${2:-$(dirname "$0")}
D=${3:-/tmp/morserve-bench-360m}
M="$BUILD/server/morserve"
mkdir -p "$OUT"
shape=(--hidden 960 --heads 15 --kv-heads 5 --intermediate 2560 --vocab 32000 --dtype bf16
       --tie-embeddings --max-pos 2048 --layers 32)
[ -d "$D/vanilla" ] || "$M" mkmodel --family vanilla "${shape[@]}" --out "$D/vanilla" >/dev/null
[ -d "$D/mor3" ] || "$M" mkmodel --family mor-ec "${shape[@]}" --recursions 3 --sharing middle_cycle \
  --depth-mix 0.3333333,0.3333333,0.3333334 --out "$D/mor3" >/dev/null
FORMATS=${FORMATS:-"auto int8 w8a8$(grep -qw amx_bf16 /proc/cpuinfo && echo ' amx-bf16')"}
lscpu | grep -E "Model name|^Flags" >"$OUT/cpu.txt"
for w in $FORMATS; do
  "$M" bench --models "$D/vanilla" --requests 4 --mean-tokens 48 --std-tokens 0 --prompt-len 4 \
    --batches 1 --modes depth --warmup 2 --repeats 2 --weights "$w" --kv-cache-mb 256 \
    --out "$OUT/batch1_$w.json" >/dev/null
done
for b in 8 32; do
  for w in $FORMATS; do
    "$M" bench --models "$D/vanilla,$D/mor3" --requests $((b * 3)) --mean-tokens 32 --std-tokens 8 \
      --prompt-len 4 --batches "$b" --modes depth,sequence --warmup 2 --repeats 2 --temperature 1.0 \
      --kv-cache-mb 512 --weights "$w" --out "$OUT/batch${b}_$w.json" >/dev/null
  done
done
for w in $FORMATS; do
  "$M" bench --models "$D/vanilla" --requests 1 --mean-tokens 1 --std-tokens 0 --batches 1 \
    --modes depth --warmup 1 --prefill 512 --repeats 2 --max-step-tokens 512 --kv-cache-mb 256 \
    --weights "$w" --out "$OUT/prefill512_$w.json" >/dev/null
done
"$BUILD/tests/bench/weight_format_accuracy_bench" "$D/vanilla" int8,w8a8 8 32 >"$OUT/accuracy.json"
"$BUILD/tests/bench/cpu_linear_bench" --formats bf16,int8,w8a8 >"$OUT/cpu_linear_bench.json"
echo "wrote $OUT"
