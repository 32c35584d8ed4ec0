#!/usr/bin/env bash
# Gateway CPU time per streamed token (not a test; docs/benchmarks.md "Gateway"): the real
# `morserve serve` on MODEL_DIR behind `morserve-gateway`, REQS streaming completions
# (token-id prompt, TOK tokens each, ignore_eos, greedy) from CONC concurrent curl clients.
# The gateway's user+system CPU (from /proc) over the run is divided by the tokens it
# streamed (its own morserve_gateway_completion_tokens_total). Prints one JSON object.
#
# usage: tests/gateway/gateway_cpu_bench.sh BUILD_DIR MODEL_DIR [THREADS]
#   env: CONC (32), REQS (128), TOK (128)
set -euo pipefail
build=$1 model=$2 threads=${3:-2}
conc=${CONC:-32} reqs=${REQS:-128} tok=${TOK:-128}
work=$(mktemp -d)
trap 'kill $gw $srv 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

"$build/server/morserve" serve --model "$model" --port 0 --metrics-port 0 >"$work/s.log" 2>&1 &
srv=$!
for _ in $(seq 300); do grep -q "metrics on" "$work/s.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [0-9.:]*" "$work/s.log" | cut -d' ' -f3)
"$build/server/gateway/morserve-gateway" --backend "$addr" --port 0 --threads "$threads" \
  >"$work/g.log" 2>&1 &
gw=$!
for _ in $(seq 100); do grep -q "gateway listening" "$work/g.log" && break; sleep 0.1; done
port=$(grep -o "127.0.0.1:[0-9]*" "$work/g.log" | cut -d: -f2)
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && break
  sleep 0.1
done
# Warm-up: the backend's first request pays for its lazy set-up.
curl -s -o /dev/null "localhost:$port/v1/completions" -d '{"prompt":[1,2],"max_tokens":2}'

body="{\"prompt\":[1,2,3,4,5,6,7,8],\"max_tokens\":$tok,\"ignore_eos\":true,\"stream\":true,\"temperature\":0}"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$gw/stat"; }
tokens() { curl -s "localhost:$port/metrics" | awk '/^morserve_gateway_completion_tokens_total/ {print $2}'; }
k0=$(tokens) c0=$(cpu_ticks) t0=$(date +%s.%N)
seq "$reqs" | xargs -P "$conc" -I{} curl -sN -o /dev/null "localhost:$port/v1/completions" -d "$body"
t1=$(date +%s.%N) c1=$(cpu_ticks) k1=$(tokens)
ok=$(curl -s "localhost:$port/metrics" |
  awk -F' ' '/^morserve_gateway_requests_total\{code="200",endpoint="completions"\}/ {print $2}')
python3 - "$conc" "$reqs" "$threads" "$k0" "$k1" "$c0" "$c1" "$t0" "$t1" "$ok" <<'PY'
import json, os, sys
conc, reqs, threads = map(int, sys.argv[1:4])
k0, k1, c0, c1, t0, t1, ok = map(float, sys.argv[4:11])
hz = os.sysconf("SC_CLK_TCK")
tokens, wall, cpu = k1 - k0, t1 - t0, (c1 - c0) / hz
print(json.dumps({"concurrency": conc, "requests": reqs, "requests_ok": int(ok) - 1,
                  "gateway_threads": threads, "tokens": int(tokens), "wall_s": round(wall, 2),
                  "tokens_per_s": round(tokens / wall, 1), "gateway_cpu_s": round(cpu, 2),
                  "gateway_cpu_us_per_token": round(cpu / tokens * 1e6, 1)}))
PY
