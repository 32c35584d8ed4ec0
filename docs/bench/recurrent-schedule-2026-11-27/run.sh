#!/usr/bin/env bash
# The shared recurrent schedule on the CPU, before and after, side by side (issue 22):
# BASE = a Release CPU build of the commit before (build-cpu of a worktree), NEW = this one.
# 1. one prompt alone: recurrent_prefill_bench (tiled and naive, 128..1024 tokens, best of 2);
# 2. 8 prompts of 512 tokens entering together (max_step_tokens 2048: 4 chunks per step).
set -euo pipefail
BASE=${BASE:?base build dir} NEW=${NEW:?new build dir} OUT=${OUT:-.}
m=/tmp/rbench/rec4
[ -d $m ] || "$NEW/server/morserve" mkmodel --family recurrent --hidden 960 --heads 15 --kv-heads 5 \
  --intermediate 2560 --vocab 49152 --layers 4 --max-pos 4200 --out $m
for r in 1 2; do
  for w in base new; do
    d=$BASE; [ $w = new ] && d=$NEW
    "$d/tests/bench/recurrent_prefill_bench" $m 1024 2 2 cpu >"$OUT/pf-$w-$r.json"
  done
done
for r in 1 2; do
  for w in base new; do
    d=$BASE; [ $w = new ] && d=$NEW
    "$d/server/morserve" bench --models $m --prompt-len 512 --requests 8 --mean-tokens 2 --std-tokens 0 \
      --batches 2048 --modes depth --membw-mb 0 --warmup 0 --threads 2 --out "$OUT/ec-$w-$r.json"
  done
done
