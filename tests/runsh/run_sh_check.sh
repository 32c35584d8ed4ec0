#!/usr/bin/env bash
# ctest for ./run.sh --check with the binaries already built in BUILD_DIR (SKIP_BUILD=1, so
# no apt-get or cmake inside the test) and free ports (0): run.sh trains the demo tokenizer,
# writes the demo model, starts `morserve serve` and `morserve-gateway`, gets a 200 chat
# completion with 24 generated tokens and stops both. Then this script checks that both
# servers are really gone (their ports refuse connections) and that a broken setup fails with
# a clear message instead of hanging.
# usage: run_sh_check.sh BUILD_DIR WORK_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work"
fail() { echo "run_sh_check: FAIL: $*" >&2; exit 1; }

out="$work/run.log"
if ! BUILD_DIR="$build" SKIP_BUILD=1 PORT=0 GRPC_PORT=0 METRICS_PORT=0 DEMO_DIR="$work/demo" \
    timeout 300 "$root/run.sh" --check >"$out" 2>&1; then
  cat "$out" >&2
  fail "run.sh --check exited non-zero"
fi
cat "$out"
grep -q '^run.sh --check: OK (HTTP 200, 24 generated tokens)' "$out" || fail "no OK line"
grep -q '"finish_reason":"length"' "$out" || fail "the chat completion did not run to max_tokens"

# Both servers stopped: the ports run.sh printed refuse connections now.
api=$(sed -n 's|^OpenAI-compatible API on http://\([^ ]*\) .*|\1|p' "$out")
grpc=$(sed -n 's/^gRPC on \([^,]*\),.*/\1/p' "$out")
[ -n "$api" ] && [ -n "$grpc" ] || fail "run.sh did not print the gateway and gRPC addresses"
accepts() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }  # a TCP connect succeeds
for addr in "$api" "$grpc"; do
  if accepts "$addr"; then fail "$addr still accepts connections after run.sh --check"; fi
done

# A missing build fails at once, naming the binary.
if BUILD_DIR="$work/no-build" SKIP_BUILD=1 "$root/run.sh" --check >"$work/bad.log" 2>&1; then
  fail "run.sh --check succeeded without binaries"
fi
grep -q "SKIP_BUILD=1 but $work/no-build/server/morserve is not built" "$work/bad.log" ||
  { cat "$work/bad.log" >&2; fail "unclear error without binaries"; }
echo "run_sh_check: OK"
