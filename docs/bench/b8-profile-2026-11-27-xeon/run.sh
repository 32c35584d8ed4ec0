#!/usr/bin/env bash
# Batch 1 vs batch 8 in steady state (every request the same length, two waves of `batch`
# requests, so a batch-8 decode step holds 8 rows), the vanilla 360M model of
# scripts/bench_cpu_360m.sh (`scripts/bench_cpu_360m.sh build-cpu /tmp/b360` makes it), base vs new
# binaries side by side, ROUNDS in alternating order; WEIGHTS (default amx-bf16).
# usage: run.sh BASE_MORSERVE NEW_MORSERVE OUT_DIR ["1 2"]
set -eu
BASE=$1 NEW=$2 OUT=$3 ROUNDS=${4:-"1 2"}
mkdir -p $OUT
for r in $ROUNDS; do
  for w in base new; do
    M=$BASE; [ $w = new ] && M=$NEW
    for b in 1 8; do
      $M bench --models /tmp/b360/vanilla --weights ${WEIGHTS:-amx-bf16} --requests $((b*2)) --mean-tokens 64 --std-tokens 0 \
        --prompt-len 4 --batches $b --modes depth --warmup 2 --membw-mb 0 --threads 2 --kv-cache-mb 256 \
        --out $OUT/$w-b$b-r$r.json > /dev/null 2>&1
    done
  done
done
python3 - "$OUT" <<'PY'
import json,glob,sys,collections
T=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/*-b*-r*.json')):
  w,b,r=f.split('/')[-1][:-5].split('-')
  s=json.load(open(f))['runs'][0]['stats']
  T[(w,b)].append((s['tokens_per_s'], 1000*s['seconds']/s['steps']))
for k in sorted(T): print(k, [(round(a,1),round(b,2)) for a,b in T[k]])
for w in ['base','new']:
  if (w,'b1') in T and (w,'b8') in T:
    b1=sum(a for a,_ in T[(w,'b1')])/len(T[(w,'b1')]); b8=sum(a for a,_ in T[(w,'b8')])/len(T[(w,'b8')])
    print(w, 'b8/b1 =', round(b8/b1,2))
PY
