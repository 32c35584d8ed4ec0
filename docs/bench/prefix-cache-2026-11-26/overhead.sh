#!/usr/bin/env bash
# What the prefix cache's bookkeeping costs when nothing is shared: the engine benchmark (random
# 4-token prompts, so no request finds another's blocks, while every completed block is still
# cached, looked up and evicted) with --prefix-cache on and off, same binary, alternated three
# times on small vanilla and MoR-3 models:
#   overhead.sh MORSERVE [OUT_DIR]
set -euo pipefail
M=$1
D=${2:-/tmp/pc-overhead}
mkdir -p "$D"
shape=(--hidden 512 --heads 8 --kv-heads 4 --intermediate 1536 --vocab 8192 --dtype bf16 --max-pos 1024
       --layers 8)
[ -d "$D/vanilla" ] || "$M" mkmodel --family vanilla "${shape[@]}" --out "$D/vanilla"
[ -d "$D/mor3" ] || "$M" mkmodel --family mor-ec "${shape[@]}" --recursions 3 --sharing middle_cycle \
  --depth-mix 0.3333333,0.3333333,0.3333334 --out "$D/mor3"
lscpu | grep -E "Model name|^Flags" >"$D/cpu.txt"
for round in 1 2 3; do
  for pc in on off; do
    # 16 MiB of KV: the cache fills and evicts during the run.
    "$M" bench --models "$D/vanilla,$D/mor3" --requests 24 --mean-tokens 32 --std-tokens 8 \
      --prompt-len 4 --batches 1,8 --modes depth,sequence --warmup 2 --repeats 2 --temperature 1.0 \
      --kv-cache-mb 16 --membw-mb 0 --prefix-cache "$pc" --out "$D/${pc}${round}.json" >/dev/null 2>&1
  done
done
echo "wrote $D/{on,off}{1,2,3}.json"
