#!/usr/bin/env bash
# A/B of two morserve builds (same configuration: cmake -DMORSERVE_CUDA=OFF -DMORSERVE_SERVER=OFF,
# RelWithDebInfo), alternated three times on small vanilla and MoR-3 models:
#   ab.sh NEW_MORSERVE OLD_MORSERVE [OUT_DIR]
set -euo pipefail
NEW=$1
OLD=$2
D=${3:-/tmp/ab}
mkdir -p "$D"
shape=(--hidden 512 --heads 8 --kv-heads 4 --intermediate 1536 --vocab 8192 --dtype bf16 --max-pos 1024
       --layers 8)
[ -d "$D/vanilla" ] || "$NEW" mkmodel --family vanilla "${shape[@]}" --out "$D/vanilla"
[ -d "$D/mor3" ] || "$NEW" mkmodel --family mor-ec "${shape[@]}" --recursions 3 --sharing middle_cycle \
  --depth-mix 0.3333333,0.3333333,0.3333334 --out "$D/mor3"
lscpu | grep -E "Model name|^Flags" >"$D/cpu.txt"
for round in 1 2 3; do
  for which in new old; do
    M=$NEW
    [ "$which" = old ] && M=$OLD
    "$M" bench --models "$D/vanilla,$D/mor3" --requests 24 --mean-tokens 32 --std-tokens 8 \
      --prompt-len 4 --batches 1,8 --modes depth,sequence --warmup 2 --repeats 2 --temperature 1.0 \
      --kv-cache-mb 256 --membw-mb 0 --out "$D/${which}${round}.json" >/dev/null 2>&1
  done
done
echo "wrote $D/{new,old}{1,2,3}.json"
