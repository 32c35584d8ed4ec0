#!/usr/bin/env bash
# Batch-1 decode, the vanilla 360M model (scripts/bench_cpu_360m.sh build-cpu /tmp/b360), ROUNDS
# in alternating order: BASE (weights on 4 KiB pages), BASE with glibc's huge-page tunable
# (every mmap'd allocation advised MADV_HUGEPAGE) and HP (a build with tried.patch applied:
# packed weights carved from 64 MiB slabs of advised huge pages).
#   run.sh OUT "1 2 3" /tmp/bin/base-morserve /tmp/bin/hp-morserve
set -eu
OUT=$1 ROUNDS=$2 BASE=$3 HP=$4
mkdir -p "$OUT"
lscpu | grep -E "Model name|^Flags|CPU family|^Model:" > "$OUT/cpu.txt"
for r in $ROUNDS; do
  for cfg in base:0:$BASE base-thp:1:$BASE hp:0:$HP; do
    label=${cfg%%:*} rest=${cfg#*:} t=${rest%%:*} bin=${rest#*:}
    GLIBC_TUNABLES=glibc.malloc.hugetlb=$t "$bin" bench --models /tmp/b360/vanilla --std-tokens 0 \
      --prompt-len 4 --modes depth --threads 2 --requests 4 --mean-tokens 48 --batches 1 \
      --warmup 2 --repeats 3 --kv-cache-mb 256 --weights auto --membw-mb 0 \
      --out "$OUT/c-$label-r$r.json" > /dev/null 2>&1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['runs'][0]['stats']; \
print(sys.argv[2], [round(x, 1) for x in s['tokens_per_s_all_repeats']])" "$OUT/c-$label-r$r.json" "$label r$r"
  done
done
