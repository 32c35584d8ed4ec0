#!/usr/bin/env bash
# The demo: install what is missing, build `morserve` and `morserve-gateway`, train the demo
# tokenizer (`morserve mktokenizer`, a byte-level BPE on the licence texts of every Debian
# system and this repo's docs), write the demo model (`morserve mkmodel`: a small
# random-weight MoR expert-choice model; its output is gibberish by design), start
# `morserve serve` (gRPC) and `morserve-gateway` (OpenAI-compatible HTTP) in the background,
# wait for /health, send one chat completion with curl and print it, print curl commands to
# try, and keep both running until Ctrl-C (both are stopped on exit).
#
#   ./run.sh            the demo, in the foreground until Ctrl-C
#   ./run.sh --check    (or RUN_SH_CHECK=1) the same, then check the chat completion is a 200
#                       with generated text, stop both and exit 0 (non-zero on any failure)
#
# Environment: BUILD_DIR (build), MORSERVE_CUDA (AUTO), JOBS (nproc), HOST (127.0.0.1),
# PORT (gateway, 8000), GRPC_PORT (50051), METRICS_PORT (9400); 0 picks free ports.
# SKIP_BUILD=1 uses the binaries already in BUILD_DIR (no apt-get, no cmake). DEMO_DIR
# (BUILD_DIR/demo) holds the tokenizer, the model and the two servers' logs.
set -euo pipefail
cd "$(dirname "$0")"

CHECK=${RUN_SH_CHECK:-0}
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
[ "$CHECK" = 0 ] || CHECK=1

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
GRPC_PORT=${GRPC_PORT:-50051}
METRICS_PORT=${METRICS_PORT:-9400}
DEMO_DIR=${DEMO_DIR:-$BUILD_DIR/demo}
BIN="$BUILD_DIR/server/morserve"
GATEWAY="$BUILD_DIR/server/gateway/morserve-gateway"
MODEL_NAME=morserve-demo

step() { echo; echo "==> $*"; }
die() { echo "run.sh: $*" >&2; exit 1; }

if [ "${SKIP_BUILD:-0}" = 1 ]; then
  [ -x "$BIN" ] || die "SKIP_BUILD=1 but $BIN is not built"
else
  scripts/install_deps.sh
  launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B "$BUILD_DIR" -G Ninja -DMORSERVE_CUDA="${MORSERVE_CUDA:-AUTO}" \
    "${launcher[@]}" >/dev/null
  targets=(morserve)
  if grep -q '^morserve-gateway:' <<<"$(cmake --build "$BUILD_DIR" --target help)"; then
    targets+=(morserve-gateway)
  fi
  cmake --build "$BUILD_DIR" --target "${targets[@]}" -- -j"$JOBS"
fi
commands=$("$BIN" --help 2>&1 || true)  # usage, exit status 2
if ! grep -qE '^ +serve ' <<<"$commands"; then
  die "$BIN has no 'serve' command (configure with -DMORSERVE_SERVER=ON)"
fi
command -v curl >/dev/null || die "curl is required (scripts/install_deps.sh installs it)"

# ---- The demo tokenizer and model ---------------------------------------------------------
mkdir -p "$DEMO_DIR"
TOKENIZER="$DEMO_DIR/tokenizer"
MODEL="$DEMO_DIR/model"
corpus=/usr/share/common-licenses,README.md
for f in docs/*.md; do [ -f "$f" ] && corpus+=",$f"; done
step "$BIN mktokenizer --corpus $corpus --vocab-size 4096 --out $TOKENIZER"
"$BIN" mktokenizer --corpus "$corpus" --vocab-size 4096 --out "$TOKENIZER"
# 8 layers (2 unique + 2 shared x 3 loops), hidden 256: a few ms per token on a laptop CPU.
mkmodel=(mkmodel --family mor-ec --hidden 256 --heads 4 --kv-heads 2 --intermediate 688
         --max-pos 2048 --seed 7 --tokenizer-dir "$TOKENIZER" --out "$MODEL")
step "$BIN ${mkmodel[*]}"
"$BIN" "${mkmodel[@]}"

# ---- Servers ----------------------------------------------------------------------------
SERVE_PID=""
GATEWAY_PID=""
cleanup() {
  local pid
  for pid in $GATEWAY_PID $SERVE_PID; do kill "$pid" 2>/dev/null || true; done
  for pid in $GATEWAY_PID $SERVE_PID; do wait "$pid" 2>/dev/null || true; done
  GATEWAY_PID=""
  SERVE_PID=""
}
trap cleanup EXIT
trap 'echo; echo "run.sh: stopping"; exit 130' INT TERM

# Waits until LOG has a line "PREFIX HOST:PORT" and prints PORT; fails if PID dies first.
wait_for_port() {
  local pid=$1 log=$2 prefix=$3 line
  for _ in $(seq 600); do
    line=$(grep -m1 "^$prefix " "$log" || true)
    if [ -n "$line" ]; then echo "${line##*:}"; return 0; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "run.sh: no '$prefix HOST:PORT' line from pid $pid; its log ($log):" >&2
  tail -n 20 "$log" >&2
  return 1
}

step "$BIN serve --model $MODEL --host $HOST --port $GRPC_PORT --metrics-port $METRICS_PORT"
"$BIN" serve --model "$MODEL" --host "$HOST" --port "$GRPC_PORT" --metrics-port "$METRICS_PORT" \
  >"$DEMO_DIR/serve.log" 2>&1 &
SERVE_PID=$!
grpc_port=$(wait_for_port "$SERVE_PID" "$DEMO_DIR/serve.log" "listening on")
metrics_port=$(wait_for_port "$SERVE_PID" "$DEMO_DIR/serve.log" "metrics on")
echo "gRPC on $HOST:$grpc_port, Prometheus metrics on http://$HOST:$metrics_port/metrics" \
  "(log: $DEMO_DIR/serve.log)"

if [ ! -x "$GATEWAY" ]; then
  echo
  echo "run.sh: $GATEWAY is not built: serving gRPC only (proto/morserve/v1/morserve.proto)."
  [ "$CHECK" = 0 ] || die "--check needs the gateway"
  echo "Stop with Ctrl-C."
  wait "$SERVE_PID"
  exit $?
fi
step "$GATEWAY --backend $HOST:$grpc_port --host $HOST --port $PORT --served-model-name $MODEL_NAME"
"$GATEWAY" --backend "$HOST:$grpc_port" --host "$HOST" --port "$PORT" \
  --served-model-name "$MODEL_NAME" >"$DEMO_DIR/gateway.log" 2>&1 &
GATEWAY_PID=$!
port=$(wait_for_port "$GATEWAY_PID" "$DEMO_DIR/gateway.log" "gateway listening on")
URL="http://$HOST:$port"
echo "OpenAI-compatible API on $URL (log: $DEMO_DIR/gateway.log)"

# /health is 200 once the backend reports SERVING (after its warm-up token).
healthy=0
for _ in $(seq 300); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; then healthy=1; break; fi
  kill -0 "$SERVE_PID" 2>/dev/null && kill -0 "$GATEWAY_PID" 2>/dev/null || break
  sleep 0.2
done
[ "$healthy" = 1 ] || { tail -n 20 "$DEMO_DIR/serve.log" "$DEMO_DIR/gateway.log" >&2; die "$URL/health never returned 200"; }

# ---- One real request -------------------------------------------------------------------
CHAT_BODY='{"model": "'$MODEL_NAME'", "messages": [{"role": "user", "content": "Hello! What is a Mixture-of-Recursions model?"}], "max_tokens": 24, "temperature": 0.8, "seed": 7, "ignore_eos": true}'
step "curl $URL/v1/chat/completions -d '$CHAT_BODY'"
response=$(curl -sS -w '\n%{http_code}' "$URL/v1/chat/completions" \
  -H 'Content-Type: application/json' -d "$CHAT_BODY") || die "curl failed"
status=${response##*$'\n'}
body=${response%$'\n'*}
echo "$body"
echo "(HTTP $status)"

if [ "$CHECK" = 1 ]; then
  [ "$status" = 200 ] || die "check: HTTP $status, expected 200"
  grep -q '"object":"chat.completion"' <<<"$body" || die "check: not a chat.completion"
  grep -qE '"content":"([^"\\]|\\.)' <<<"$body" || die "check: the reply has no generated text"
  grep -qE '"completion_tokens":24[,}]' <<<"$body" || die "check: expected 24 completion tokens"
  echo
  echo "run.sh --check: OK (HTTP 200, 24 generated tokens); stopping both servers"
  exit 0
fi

cat <<EOF

The demo model is a random-weight MoR model with an in-tree trained BPE tokenizer: its
text is gibberish by design; the point is the serving path. Try (model "$MODEL_NAME"):

  curl $URL/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL_NAME", "prompt": "The GNU General Public License", "max_tokens": 32}'
  curl $URL/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL_NAME", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'
  curl -N $URL/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$MODEL_NAME", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32, "stream": true}'
  curl $URL/v1/models
  curl $URL/metrics                      # the gateway's own metrics
  curl http://$HOST:$metrics_port/metrics   # the engine's (batch fill, rows per loop, KV use)

Serve a real checkpoint instead: $BIN serve --model DIR (convert first with
'$BIN convert'; see README.md). Stop with Ctrl-C.
EOF
# Until Ctrl-C, or until one of the servers exits (an error: its log says why).
set +e
wait -n "$SERVE_PID" "$GATEWAY_PID"
rc=$?
echo "run.sh: a server exited (status $rc); logs: $DEMO_DIR/serve.log $DEMO_DIR/gateway.log" >&2
exit 1
