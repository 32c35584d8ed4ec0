#!/usr/bin/env bash
# Huginn-0125 adaptive depth on the CPU engine: a Huginn-shaped model scaled to a 2-core
# machine (hidden 1024, 16 heads MHA, prelude 2 / core 4 / coda 2 SandwichBlocks, vocab 32000,
# bf16) with 8 recurrences (mean_recurrence, the num_steps of the issue), the same weights served in full mode (every token runs
# 8 recurrences) and in adaptive mode (decode tokens stop by the KL rule, each check running
# ln_f, the coda and the head inside the pass), each with depth-wise and sequence-wise batching
# at batch 1, 8 and 32, in one `morserve bench` run so the figures sit side by side. The KL
# threshold Q sets the exit mix (exits_per_loop in the JSON; the random weights move the state so
# much per recurrence that KL stays above 1 nat: Q = 10 gives exits after 2-7 recurrences, mean
# about 4); sampled tokens (temperature 0.8)
# give every request its own.
#
# STEPS=32 Q=2 is the released mean_recurrence with exits after 2-15 recurrences (mean about 8).
#
#   [STEPS=8] [Q=10] [WEIGHTS=auto|w8a8|amx-bf16|...] docs/bench/huginn-adaptive-2026-11-27/run.sh MORSERVE [OUT_DIR] [MODEL_DIR]
set -euo pipefail
M=$1
OUT=${2:-$(dirname "$0")}
D=${3:-/tmp/huginn-bench}
STEPS=${STEPS:-8}
Q=${Q:-10}
REQUESTS=${REQUESTS:-32}
WEIGHTS=${WEIGHTS:-auto}
mkdir -p "$D" "$OUT"
shape=(--family huginn --hidden 1024 --heads 16 --kv-heads 16 --intermediate 2816 --vocab 32000
       --dtype bf16 --max-pos 1024 --prelude 2 --coda 2 --recursions "$STEPS" --layers $((4 * STEPS + 4)) --exit-threshold "$Q")
"$M" mkmodel "${shape[@]}" --loop-mode full --out "$D/huginn-full" >/dev/null
"$M" mkmodel "${shape[@]}" --loop-mode adaptive --out "$D/huginn-adaptive" >/dev/null
lscpu | grep -E "Model name|^Flags" >"$OUT/cpu.txt"
"$M" bench --models "$D/huginn-full,$D/huginn-adaptive" --requests "$REQUESTS" --mean-tokens 16 \
  --std-tokens 4 --prompt-len 16 --batches 1,8,32 --modes depth,sequence --warmup 2 --temperature 0.8 \
  --membw-mb 512 --weights "$WEIGHTS" --out "$OUT/bench_${WEIGHTS}_steps$STEPS.json"
