#!/usr/bin/env bash
# Huginn adaptive on the CPU engine: sampling a token that left at an exit check from the
# logits the check kept (86a263c) against running the final norm and LM head again in the tail
# (cb4a277), the same model and workload through two `morserve` binaries, alternated in
# rounds (base, new, base, new, ...) so that the machine's drift hits both.
# The model and workload are those of docs/bench/huginn-adaptive-2026-11-27/run.sh (hidden 1024,
# 16 heads MHA, prelude 2 / core 4 / coda 2, vocab 32000, bf16, STEPS recurrences, KL threshold
# Q; 16-token prompts, 16 +- 4 sampled tokens at temperature 0.8), adaptive mode, depth-wise.
#
#   [STEPS=8] [Q=10] [ROUNDS=2] [BATCHES=1,8] run.sh BASE_MORSERVE NEW_MORSERVE [OUT_DIR] [MODEL_DIR]
set -euo pipefail
BASE=$1
NEW=$2
OUT=${3:-$(dirname "$0")}
D=${4:-/tmp/huginn-kept-bench}
STEPS=${STEPS:-8}
Q=${Q:-10}
ROUNDS=${ROUNDS:-2}
BATCHES=${BATCHES:-1,8}
REQUESTS=${REQUESTS:-32}
mkdir -p "$D" "$OUT"
shape=(--family huginn --hidden 1024 --heads 16 --kv-heads 16 --intermediate 2816 --vocab 32000
       --dtype bf16 --max-pos 1024 --prelude 2 --coda 2 --recursions "$STEPS" --layers $((4 * STEPS + 4)) --exit-threshold "$Q")
"$NEW" mkmodel "${shape[@]}" --loop-mode adaptive --out "$D/huginn-adaptive" >/dev/null
lscpu | grep -E "Model name|^Flags" >"$OUT/cpu.txt"
for round in $(seq 1 "$ROUNDS"); do
  for which in base new; do
    bin=$BASE
    [ "$which" = new ] && bin=$NEW
    "$bin" bench --models "$D/huginn-adaptive" --requests "$REQUESTS" --mean-tokens 16 --std-tokens 4 \
      --prompt-len 16 --batches "$BATCHES" --modes depth --warmup 2 --temperature 0.8 \
      --out "$OUT/${which}_steps${STEPS}_r$round.json" >/dev/null
    echo "round $round $which done"
  done
done
