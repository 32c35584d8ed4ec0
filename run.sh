#!/usr/bin/env bash
# The main job available today: install what is missing, build the `morserve` CLI, write a
# deterministic random MoR (expert-choice) demo model, inspect it, and run the engine on it
# with `morserve generate` when the CLI has that command. Once the gRPC server and gateway
# exist, this becomes "start them with the demo model".
# Environment knobs: BUILD_DIR (default build), MORSERVE_CUDA (default AUTO), JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")"

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
BIN="$BUILD_DIR/server/morserve"
MODEL="$BUILD_DIR/demo-model"

scripts/install_deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DMORSERVE_CUDA="${MORSERVE_CUDA:-AUTO}" >/dev/null
cmake --build "$BUILD_DIR" --target morserve -- -j"$JOBS"

step() { echo; echo "==> $*"; }

step "$BIN mkmodel --family mor-ec --out $MODEL"
"$BIN" mkmodel --family mor-ec --out "$MODEL"

step "$BIN inspect $MODEL"
"$BIN" inspect "$MODEL"

# `morserve --help` lists the commands this build has (it prints usage and exits 2).
commands=$("$BIN" --help 2>&1 || true)
if grep -qE '^ +generate ' <<<"$commands"; then
  step "$BIN generate --model $MODEL --prompt-ids 1,2,3 --max-tokens 16 --json"
  "$BIN" generate --model "$MODEL" --prompt-ids 1,2,3 --max-tokens 16 --json
  next="$BIN generate --model $MODEL --prompt-ids 5,6,7 --max-tokens 32 --temperature 0.8 --seed 7 --json"
else
  echo
  echo "(this build has no 'generate' command yet: inspect only)"
  next="$BIN mkmodel --family mor-tc --router-bias 1 --out $BUILD_DIR/demo-tc && $BIN inspect $BUILD_DIR/demo-tc"
fi

echo
echo "run.sh: built $BIN, wrote a mor-ec demo model to $MODEL and inspected it$(
  grep -qE '^ +generate ' <<<"$commands" && echo ', then generated 16 tokens from it')."
if grep -qE '^ +bench ' <<<"$commands"; then
  echo "Throughput (depth-wise vs sequence-wise batching): $BIN bench --models $MODEL --requests 100 --mean-tokens 32 --std-tokens 8"
fi
if grep -qE '^ +serve ' <<<"$commands"; then
  echo "Serve it over gRPC (proto/morserve/v1/morserve.proto, metrics on :9400/metrics):"
  echo "  $BIN serve --model $MODEL --port 50051 --metrics-port 9400"
fi
echo "Next, try: $next"
