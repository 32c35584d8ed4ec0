#!/usr/bin/env bash
# Batch-1 decode at a long context, base vs new morserve (HEAD and HEAD + the attention
# prefetch): one request with a 1536-token prompt entering in one step, generating 1 and 129
# tokens; (t129 - t1) / 128 is the time of a decode step at context 1536..1664. The vanilla 360M
# model of scripts/bench_cpu_360m.sh in /tmp/b360, amx-bf16, 2 threads. The short-context
# batch-1 / batch-8 check beside it: docs/bench/b8-profile-2026-11-27-xeon/run.sh.
# usage: run.sh BASE_MORSERVE NEW_MORSERVE OUT_DIR
set -eu
BASE=$1 NEW=$2 OUT=$3
mkdir -p "$OUT"
for r in 1 2; do
  for w in base new; do
    M=$BASE; [ $w = new ] && M=$NEW
    for t in 1 129; do
      "$M" bench --models /tmp/b360/vanilla --weights amx-bf16 --requests 1 --mean-tokens $t --std-tokens 0 \
        --prompt-len 1536 --batches 2048 --modes depth --warmup 0 --membw-mb 0 --threads 2 \
        --kv-cache-mb 1024 --out "$OUT/d-$w-$t-$r.json" >/dev/null 2>&1
    done
  done
done
