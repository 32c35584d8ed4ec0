#!/usr/bin/env bash
# Stands in for `docker build --target server/gateway` + `docker run` where no Docker engine
# runs (this project's machines): debootstraps Debian bookworm minbase (what
# debian:bookworm-slim is), installs the runtime-cpu stage's package list read from
# deploy/docker/Dockerfile and its user, copies the built binaries and the health check in
# as the Dockerfile does, then runs the server and the gateway inside it as uid 10001 on a
# tiny model: the health check must pass, the gateway must answer /health and a completion.
# Needs root (debootstrap, chroot, mount) and the Debian mirror. Not part of ctest (minutes,
# network); run by hand: deploy/docker/check-runtime-rootfs.sh BUILD_DIR [ROOTFS_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: check-runtime-rootfs.sh BUILD_DIR [ROOTFS_DIR]}
root=${2:-$(mktemp -d /tmp/morserve-rootfs.XXXXXX)}
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
[ -x "$root/usr/bin/apt-get" ] || debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
# The runtime-cpu stage's `apt-get install` list, as written in the Dockerfile.
pkgs=$(sed -n '/^FROM debian:bookworm-slim AS runtime-cpu/,/^FROM/p' deploy/docker/Dockerfile |
  sed -n '/apt-get install/,/rm -rf/p' | grep -v 'apt-get install\|rm -rf' | tr -d '\\&' | xargs)
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" sh -c "apt-get update -q && apt-get install -y -q --no-install-recommends $pkgs"
chroot "$root" sh -c "id morserve >/dev/null 2>&1 || useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin morserve"
install -D -m 0755 "$build/server/morserve" "$root/usr/local/bin/morserve"
install -D -m 0755 "$build/server/gateway/morserve-gateway" "$root/usr/local/bin/morserve-gateway"
install -D -m 0755 deploy/docker/morserve-grpc-health "$root/usr/local/bin/morserve-grpc-health"
rm -rf "$root/model" && "$build/server/morserve" mkmodel --family mor-ec --out "$root/model" >/dev/null
mount -t proc proc "$root/proc"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 1; umount "$root/proc" || true; }
trap cleanup EXIT
as_user() { chroot --userspec=10001:10001 "$root" "$@"; }
wait_line() {  # FILE REGEX -> the port of the first "...HOST:PORT" line matching REGEX
  for _ in $(seq 300); do
    p=$(grep -o "$2 [0-9.]*:[0-9]*" "$1" | head -1 | cut -d: -f2) && [ -n "$p" ] && { echo "$p"; return; }
    sleep 0.2
  done
  echo "timed out waiting for '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
log=$(mktemp -d)
# chroot execs the program, so $! is the server's own pid.
chroot --userspec=10001:10001 "$root" /usr/local/bin/morserve serve --model /model --host 127.0.0.1 --port 0 --metrics-port 0 >"$log/server" 2>&1 &
pids+=($!)
port=$(wait_line "$log/server" "^listening on")
for _ in $(seq 100); do as_user morserve-grpc-health "127.0.0.1:$port" 2>/dev/null && break; sleep 0.3; done
as_user morserve-grpc-health "127.0.0.1:$port"
uid=$(stat -c %u "/proc/${pids[0]}")
[ "$uid" = 10001 ] || { echo "server runs as uid $uid, not 10001" >&2; exit 1; }
echo "server (uid $uid): health check passes"
chroot --userspec=10001:10001 "$root" /usr/local/bin/morserve-gateway --backend "127.0.0.1:$port" --host 127.0.0.1 --port 0 >"$log/gateway" 2>&1 &
pids+=($!)
gw=$(wait_line "$log/gateway" "gateway listening on")
for _ in $(seq 100); do as_user curl -fsS "http://127.0.0.1:$gw/health" >/dev/null 2>&1 && break; sleep 0.3; done
as_user curl -fsS "http://127.0.0.1:$gw/health"; echo
as_user curl -fsS -H 'Content-Type: application/json' \
  -d '{"model":"model","prompt":[1,2,3],"max_tokens":4}' "http://127.0.0.1:$gw/v1/completions" |
  grep -q '"completion_tokens":4'
echo "gateway: /health and a 4-token completion through the server: ok"
echo "check-runtime-rootfs: passed ($root)"
