#!/usr/bin/env bash
# The depth-wise vs sequence-wise, MoR-3 vs vanilla protocol of scripts/bench_cpu_360m.sh (batch 1,
# 8, 32; the models it makes under /tmp/b360) with the default flags, base vs new `morserve`
# binaries in turn, plus the 512-token prefill.
# usage: protocol.sh BASE_MORSERVE NEW_MORSERVE OUT_DIR
set -eu
BASE=$1 NEW=$2 OUT=$3
mkdir -p "$OUT"
for b in 1 8 32; do
  r=$(( b * 3 > 4 ? b * 3 : 4 ))
  for w in base new; do
    M=$BASE; [ $w = new ] && M=$NEW
    "$M" bench --models /tmp/b360/vanilla,/tmp/b360/mor3 --requests "$r" --mean-tokens 32 --std-tokens 8 \
      --prompt-len 4 --batches "$b" --modes depth,sequence --warmup 2 --repeats 2 --temperature 1.0 \
      --kv-cache-mb 512 --membw-mb 0 --threads 2 --out "$OUT/$w-dvs-b$b.json" > /dev/null 2>&1
  done
done
for w in base new; do
  M=$BASE; [ $w = new ] && M=$NEW
  "$M" bench --models /tmp/b360/vanilla --requests 1 --mean-tokens 1 --std-tokens 0 --batches 1 \
    --modes depth --warmup 1 --prefill 512 --repeats 2 --max-step-tokens 512 --kv-cache-mb 256 \
    --membw-mb 0 --threads 2 --out "$OUT/$w-prefill512.json" > /dev/null 2>&1
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for b in (1, 8, 32):
    for w in ('base', 'new'):
        d = json.load(open(f'{out}/{w}-dvs-b{b}.json'))
        t = {(r['model']['dir'].split('/')[-1], r['mode']): r['stats']['tokens_per_s'] for r in d['runs']}
        print(f'b{b} {w}', {k: round(v, 1) for k, v in t.items()},
              'MoR d/s %.2f' % (t[('mor3', 'depth')] / t[('mor3', 'sequence')]),
              'MoR/van %.2f' % (t[('mor3', 'depth')] / t[('vanilla', 'depth')]))
for w in ('base', 'new'):
    d = json.load(open(f'{out}/{w}-prefill512.json'))
    p = d['prefill'][0]
    print('prefill', w, 'tok/s %.1f' % p['prefill_tokens_per_s'], 'linear GFLOP/s %.1f' % p['linear_gflops'])
PY
