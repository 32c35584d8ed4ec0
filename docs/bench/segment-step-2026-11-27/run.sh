#!/usr/bin/env bash
# Side by side: the engine before (base, 023ef6b) and after (new, a0ba2a9) RunSegment, CPU.
set -euo pipefail
OUT=${1:-/tmp/segab}
for round in ${ROUNDS:-1 2}; do
  for v in base new; do
    /tmp/morserve-$v bench --models /tmp/b360/vanilla --requests 4 --mean-tokens 32 --std-tokens 0 \
      --prompt-len 4 --batches 1 --modes depth --warmup 1 --repeats 1 --kv-cache-mb 512 \
      --membw-mb 0 --out $OUT/b1_${v}_$round.json > /dev/null
    /tmp/morserve-$v bench --models /tmp/b360/vanilla,/tmp/b360/mor3 --requests 24 --mean-tokens 32 \
      --std-tokens 8 --prompt-len 4 --batches 8 --modes depth,sequence --warmup 2 --repeats 1 \
      --temperature 1.0 --kv-cache-mb 512 --membw-mb 0 --out $OUT/b8_${v}_$round.json > /dev/null
  done
done
