#!/usr/bin/env bash
# bf16 weights in place vs bf16-quads (the default on AVX-512 hosts since this change): the
# vanilla 360M model of scripts/bench_cpu_360m.sh (`scripts/bench_cpu_360m.sh build-cpu /tmp/b360`
# makes it), base vs new `morserve` binaries with the default flags (`--weights auto`), ROUNDS in
# alternating order: batch-1 decode (read bandwidth measured in the same run), steady-state
# batch 8 (two waves of 8 requests of exactly 64 tokens), peak RSS of the batch-1 run.
# usage: run.sh BASE_MORSERVE NEW_MORSERVE OUT_DIR ["1 2"]
set -eu
BASE=$1 NEW=$2 OUT=$3 ROUNDS=${4:-"1 2"}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^Flags" > "$OUT/cpu.txt"
for r in $ROUNDS; do
  for w in base new; do
    M=$BASE; [ $w = new ] && M=$NEW
    /usr/bin/time -v "$M" bench --models /tmp/b360/vanilla --requests 4 --mean-tokens 48 --std-tokens 0 \
      --prompt-len 4 --batches 1 --modes depth --warmup 2 --repeats 2 --kv-cache-mb 256 --threads 2 \
      --out "$OUT/$w-b1-r$r.json" > /dev/null 2> "$OUT/$w-b1-r$r.time"
    "$M" bench --models /tmp/b360/vanilla --requests 16 --mean-tokens 64 --std-tokens 0 \
      --prompt-len 4 --batches 8 --modes depth --warmup 2 --membw-mb 0 --threads 2 --kv-cache-mb 256 \
      --out "$OUT/$w-b8-r$r.json" > /dev/null 2>&1
  done
done
python3 - "$OUT" <<'PY'
import json, glob, sys, re, collections
T = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + '/*-b*-r*.json')):
    w, b, r = f.split('/')[-1][:-5].split('-')
    d = json.load(open(f))
    for run in d['runs']:
        s = run['stats']
        T[(w, b)].append((round(s['tokens_per_s'], 1), s.get('weight_bw_fraction'), d.get('read_bandwidth_gbs')))
    if b == 'b1':
        rss = re.search(r'Maximum resident set size \(kbytes\): (\d+)', open(f[:-5] + '.time').read())
        T[(w, 'rss_mb')].append(int(rss.group(1)) // 1024)
for k in sorted(T): print(k, T[k])
PY
