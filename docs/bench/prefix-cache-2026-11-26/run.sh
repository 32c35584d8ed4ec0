#!/usr/bin/env bash
# Automatic prefix caching on the multi-turn chat workload: two `morserve serve` processes on
# the built-in demo model (run.sh's: a random-weight MoR model on a BPE tokenizer trained
# from the licence texts and docs), one with --prefix-cache on and one with it off, both on
# 127.0.0.1 port 0, then the same `morserve-loadtest --workload chat` run against each, one
# after the other (so they do not share the CPU), and a side-by-side report. Sized for a
# 2-core machine: at most about 5 minutes in all (each run stops at DURATION).
#
#   docs/bench/prefix-cache-2026-11-26/run.sh [OUT_DIR]   (default: this directory)
#
# Environment: BUILD_DIR (build; needs morserve and morserve-loadtest built), DEMO_DIR
# (BUILD_DIR/demo-prefix-cache: tokenizer and model, made when missing), SERVER_FLAGS
# (--threads 2), CONVERSATIONS (6), TURNS (4), RATE (0.2 conversations/s), DURATION (150 s:
# the longest either run may take; open requests are cut then).
# Writes OUT_DIR/on.json and off.json (the load tester's reports, with prompt_cache and
# chat_turns), OUT_DIR/report/ (report.md, report.json and plots: side by side) and the
# load tester's tables (on.txt, off.txt); the server logs (OUT_DIR/*.server.log) are kept
# only when something failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."

out=${1:-$here}
build=${BUILD_DIR:-build}
demo=${DEMO_DIR:-$build/demo-prefix-cache}
server_flags=${SERVER_FLAGS:---threads 2}
morserve="$build/server/morserve"
loadtest="$build/loadtest/morserve-loadtest"
for bin in "$morserve" "$loadtest"; do
  [ -x "$bin" ] || { echo "run.sh: $bin is not built" >&2; exit 1; }
done
mkdir -p "$out" "$demo"

# The demo model of ./run.sh (same tokenizer corpus and mkmodel flags).
if [ ! -f "$demo/model/config.json" ]; then
  corpus=/usr/share/common-licenses,README.md
  for f in docs/*.md; do corpus+=",$f"; done
  "$morserve" mktokenizer --corpus "$corpus" --vocab-size 4096 --out "$demo/tokenizer" >/dev/null
  "$morserve" mkmodel --family mor-ec --hidden 256 --heads 4 --kv-heads 2 --intermediate 688 \
    --max-pos 2048 --seed 7 --tokenizer-dir "$demo/tokenizer" --out "$demo/model" >/dev/null
fi

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# start LABEL FLAG: a server with --prefix-cache FLAG; sets addr_LABEL and metrics_LABEL.
start() {
  local label=$1 log="$out/$1.server.log" addr="" metrics=""
  : >"$log"
  # shellcheck disable=SC2086  # server_flags is a list of flags
  "$morserve" serve --model "$demo/model" --host 127.0.0.1 --port 0 --metrics-port 0 \
    --prefix-cache "$2" $server_flags >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do
    addr=$(sed -n 's/^listening on //p' "$log" | head -1)
    metrics=$(sed -n 's/^metrics on //p' "$log" | head -1)
    [ -n "$addr" ] && [ -n "$metrics" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "run.sh: $label server exited" >&2; cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "run.sh: $label server did not start" >&2; cat "$log" >&2; exit 1; }
  printf -v "addr_$label" '%s' "$addr"
  printf -v "metrics_$label" '%s' "$metrics"
}
start on on
start off off

# The same workload and seed for both: 1 warm-up conversation (it puts the shared system
# prompt in the cache of the "on" server, as earlier traffic would), then CONVERSATIONS.
flags=(--workload chat --conversations "${CONVERSATIONS:-6}" --turns "${TURNS:-4}" --warmup 1
       --request-rate "${RATE:-0.2}" --output-len 16 --max-concurrency 4
       --duration "${DURATION:-150}" --timeout 120 --seed 1 --no-progress)
for label in on off; do
  addr_var="addr_$label" metrics_var="metrics_$label"
  echo "== prefix cache $label (${!addr_var})" >&2
  "$loadtest" run --grpc "${!addr_var}" --metrics-url "http://${!metrics_var}/metrics" \
    --label "cache-$label" --out "$out/$label.json" "${flags[@]}" >"$out/$label.txt"
  cat "$out/$label.txt"
done
"$loadtest" report --input "cache-on=$out/on.json,cache-off=$out/off.json" --out-dir "$out/report" \
  --title "Prefix cache on vs off: multi-turn chat on the demo model" >/dev/null
rm -rf "$out/report/data" "$out"/*.server.log  # gnuplot's inputs; the logs of a clean run
cat "$out/report/report.md"
