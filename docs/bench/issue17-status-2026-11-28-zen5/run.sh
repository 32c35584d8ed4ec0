#!/usr/bin/env bash
# Issue 17's targets in one sitting with one binary: batch 1 (with the read-bandwidth probe),
# steady-state batch 8 and a 512-token prefill for each weight format (2 rounds), the issue's
# protocol with default flags (batch 1..32, vanilla and MoR-3, depth-wise and sequence-wise), and
# batch 32 of the protocol with amx-bf16 and w8a8. Models: scripts/bench_cpu_360m.sh BUILD /tmp/b360.
#   run.sh build-cpu/server/morserve OUT
set -eu
M=$1 OUT=$2 HERE=$(dirname "$0")
mkdir -p "$OUT/ab" "$OUT/protocol-auto"
bash "$HERE/../prefill-lanes-2026-11-28-zen5/run.sh" "$OUT/ab" "1 2" auto="$M:auto" int8="$M:int8" \
  amx="$M:amx-bf16" w8a8="$M:w8a8" > "$OUT/ab/summary.txt"
bash "$HERE/../bf16-dot-2026-11-28-zen5/protocol.sh" "$M" "$OUT/protocol-auto" auto \
  > "$OUT/protocol-auto/summary.txt"
for w in amx-bf16 w8a8; do
  "$M" bench --models /tmp/b360/vanilla,/tmp/b360/mor3 --requests 96 --mean-tokens 32 --std-tokens 8 \
    --prompt-len 4 --batches 32 --modes depth,sequence --warmup 2 --repeats 2 --temperature 1.0 \
    --kv-cache-mb 512 --threads 2 --weights "$w" --membw-mb 0 --out "$OUT/b32-$w.json" > /dev/null 2>&1
done
