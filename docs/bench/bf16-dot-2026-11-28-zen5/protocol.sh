#!/usr/bin/env bash
# The issue-17 protocol of scripts/bench_cpu_360m.sh (vanilla 360M vs MoR-3 1 + 10 x 3 + 1 with a
# 1/3 depth mix, depth-wise vs sequence-wise, batch 1..32, N(32, 8) tokens at temperature 1, every
# ratio within one run) for each WEIGHTS in turn. usage: protocol.sh MORSERVE OUT "auto amx-bf16"
set -eu
M=$1 OUT=$2 WEIGHTS=${3:-"auto amx-bf16"}
mkdir -p "$OUT"
for b in 1 4 8 16 32; do
  r=$(( b * 3 > 4 ? b * 3 : 4 ))
  for w in $WEIGHTS; do
    "$M" bench --models /tmp/b360/vanilla,/tmp/b360/mor3 --requests "$r" --mean-tokens 32 \
      --std-tokens 8 --prompt-len 4 --batches "$b" --modes depth,sequence --warmup 2 --repeats 2 \
      --temperature 1.0 --kv-cache-mb 512 --threads 2 --weights "$w" --membw-mb 0 \
      --out "$OUT/b$b-$w.json" > /dev/null 2>&1
  done
done
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + '/b*.json'), key=lambda f: int(f.split('/')[-1][1:].split('-')[0])):
    d = json.load(open(f))
    row = {}
    for run in d['runs']:
        key = ('mor' if 'mor3' in run['model']['dir'] else 'van') + '-' + run['mode'][:3]
        row[key] = round(run['stats']['tokens_per_s'], 1)
        if 'mor3' in run['model']['dir']:
            row[key + '-fill'] = round(run['stats']['batch_fill_ratio'], 2)
    name = f.split('/')[-1][:-5]
    ratio = lambda a, b: round(row[a] / row[b], 2) if row.get(b) else None
    print(name, row, 'mor d/s', ratio('mor-dep', 'mor-seq'), 'mor/van', ratio('mor-dep', 'van-dep'))
PY
