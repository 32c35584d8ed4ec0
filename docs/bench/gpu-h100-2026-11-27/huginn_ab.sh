#!/usr/bin/env bash
# A/B on a GPU machine of the Huginn exit check's host cost: BIN/morserve-base (before: the KL
# recomputes the previous recurrence's softmax, rows one after another) and BIN/morserve
# (after: the previous log-partition kept, rows' statistics on the thread pool), on the
# Huginn-shaped model of run_on_device.sh's huginn part (mkmodel there), full and adaptive,
# depth-wise, batch 1, 8 and 32, base then new for each batch. JSON per run to $OUT.
#   usage: bash huginn_ab.sh BIN     (BIN holds morserve, morserve-base and libs.tgz)
set -uo pipefail
bin=$1
out=${OUT:-./huginn-ab-out}
mkdir -p "$out" /tmp/morserve-libs
tar xzf "$bin/libs.tgz" -C /tmp/morserve-libs
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/tmp/morserve-libs/lib
m=/tmp/morserve-models
timeout 90 "$bin/morserve" mkmodel --family huginn --hidden 2048 --heads 16 --kv-heads 16 \
  --intermediate 5632 --vocab 65536 --max-pos 2048 --prelude 2 --coda 2 --recursions 8 \
  --layers 36 --exit-threshold 10 --loop-mode full --out $m/huginn-full >/dev/null || exit 1
mkdir -p $m/huginn-adaptive && ln -f $m/huginn-full/* $m/huginn-adaptive/ &&
  rm -f $m/huginn-adaptive/looped.json &&
  echo '{"mode": "adaptive", "exit_threshold": 10}' >$m/huginn-adaptive/looped.json
for b in 1 8 32; do
  req=$((b == 1 ? 4 : b * 2))
  for which in base new; do
    exe="$bin/morserve"; [ "$which" = base ] && exe="$bin/morserve-base"
    echo "=== batch $b $which"
    timeout 60 "$exe" bench --device cuda --models $m/huginn-full,$m/huginn-adaptive --prompt-len 16 \
      --temperature 0.8 --kv-cache-mb 32768 --membw-mb 0 --modes depth --batches $b \
      --requests $req --mean-tokens 32 --std-tokens 0 --warmup 1 --out "$out/huginn-ab-$which-b$b.json" |
      grep -E '^/tmp|ratios|depth-wise' | cut -c1-140
  done
done
