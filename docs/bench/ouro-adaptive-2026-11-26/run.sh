#!/usr/bin/env bash
# Ouro adaptive depth on the CPU engine: an Ouro-1.4B-shaped model scaled to a 2-core machine
# (hidden 1024, 6 stored sandwich layers x total_ut_steps 4, 16 heads, MHA, vocab 32000, bf16),
# the same weights served in full mode (every token runs 4 loops) and in adaptive mode
# (looped.json; decode tokens stop at the exit gate's cumulative threshold), each with
# depth-wise and sequence-wise batching at batch 1, 8 and 32, in one `morserve bench` run so
# the figures sit side by side. The gate's bias and threshold set the exit mix (see
# exits_per_loop in the JSON); sampled tokens (temperature 0.8) give every request its own.
#
#   [WEIGHTS=auto|amx-bf16|...] docs/bench/ouro-adaptive-2026-11-26/run.sh MORSERVE [OUT_DIR] [MODEL_DIR]
set -euo pipefail
M=$1
OUT=${2:-$(dirname "$0")}
D=${3:-/tmp/ouro-bench}
Q=${Q:-0.7}
B=${B:-0.4}
REQUESTS=${REQUESTS:-48}
WEIGHTS=${WEIGHTS:-auto}
mkdir -p "$D" "$OUT"
shape=(--family ouro --hidden 1024 --layers 24 --recursions 4 --heads 16 --kv-heads 16
       --intermediate 2816 --vocab 32000 --dtype bf16 --max-pos 1024 --exit-threshold "$Q" --router-bias "$B")
"$M" mkmodel "${shape[@]}" --out "$D/ouro-full" >/dev/null
"$M" mkmodel "${shape[@]}" --loop-mode adaptive --out "$D/ouro-adaptive" >/dev/null
lscpu | grep -E "Model name|^Flags" >"$OUT/cpu.txt"
"$M" bench --models "$D/ouro-full,$D/ouro-adaptive" --requests "$REQUESTS" --mean-tokens 48 --std-tokens 12 \
  --prompt-len 16 --batches 1,8,32 --modes depth,sequence --warmup 4 --temperature 0.8 \
  --membw-mb 512 --weights "$WEIGHTS" --out "$OUT/bench.json"
