#!/usr/bin/env bash
# 512-token prefill (vanilla 360M, amx-bf16), base vs new binaries alternating, ROUNDS rounds.
set -eu
BASE=$1 NEW=$2 OUT=$3 ROUNDS=${4:-"1 2 3"}
mkdir -p $OUT
for r in $ROUNDS; do
  for w in base new; do
    M=$BASE; [ $w = new ] && M=$NEW
    $M bench --models /tmp/b360/vanilla --weights amx-bf16 --requests 1 --mean-tokens 1 --std-tokens 0 \
      --batches 1 --modes depth --warmup 1 --prefill 512 --repeats 2 --max-step-tokens 512 --kv-cache-mb 256 \
      --membw-mb 0 --threads 2 --out $OUT/$w-r$r.json > /dev/null 2>&1
  done
done
python3 - "$OUT" <<'PY'
import json,glob,sys,collections
T=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/*-r*.json')):
  w=f.split('/')[-1].split('-')[0]
  d=json.load(open(f))

  T[w].append(round(d['prefill'][0]['prefill_tokens_per_s'],1))
print(dict(T))
PY
