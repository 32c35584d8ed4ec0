#!/usr/bin/env bash
# Builds side by side, ROUNDS in alternating order, on the vanilla 360M model of
# scripts/bench_cpu_360m.sh (`scripts/bench_cpu_360m.sh build-cpu /tmp/b360` makes it): a
# 512-token prefill, batch-1 decode (with the read bandwidth probe) and steady-state batch 8
# (waves of requests of exactly 64 tokens). Each config is LABEL=MORSERVE_BINARY:WEIGHTS, e.g.
#   run.sh OUT "1 2" base=/tmp/bin/base-morserve:amx-bf16 new=build-cpu/server/morserve:amx-bf16
set -eu
OUT=$1 ROUNDS=$2
shift 2
mkdir -p "$OUT"
lscpu | grep -E "Model name|^Flags|CPU family|^Model:" > "$OUT/cpu.txt"
common=(--models /tmp/b360/vanilla --std-tokens 0 --prompt-len 4 --modes depth --threads 2)
for r in $ROUNDS; do
  for cfg in "$@"; do
    label=${cfg%%=*} rest=${cfg#*=}
    M=${rest%%:*} w=${rest##*:}
    "$M" bench --models /tmp/b360/vanilla --requests 1 --mean-tokens 1 --std-tokens 0 --batches 1 \
      --modes depth --warmup 1 --prefill 512 --repeats 2 --max-step-tokens 512 --kv-cache-mb 256 \
      --threads 2 --weights "$w" --out "$OUT/$label-prefill-r$r.json" > /dev/null 2>&1
    if [ -z "${PREFILL_ONLY:-}" ]; then
      "$M" bench "${common[@]}" --requests 4 --mean-tokens 48 --batches 1 --warmup 2 --repeats 2 \
        --kv-cache-mb 256 --weights "$w" --out "$OUT/$label-b1-r$r.json" > /dev/null 2>&1
      "$M" bench "${common[@]}" --requests 16 --mean-tokens 64 --batches 8 --warmup 2 --membw-mb 0 \
        --kv-cache-mb 256 --weights "$w" --out "$OUT/$label-b8-r$r.json" > /dev/null 2>&1
    fi
  done
done
python3 "$(dirname "$0")/../bf16-dot-2026-11-28-zen5/summarize.py" "$OUT"  # the same summary
