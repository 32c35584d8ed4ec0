#!/usr/bin/env bash
# Installs the Debian (bookworm) packages morserve needs, and only those that are missing:
# dpkg-query checks each one, and `apt-get update` runs only when something must be installed,
# so a second run on a ready machine takes well under a second. Shared by test.sh and run.sh.
#
# The CUDA toolkit is not a Debian package here: it is found at /usr/local/cuda when the
# machine has it (MORSERVE_CUDA=AUTO), and the build works without it.
set -euo pipefail

# Build and engine: compiler, build tools, GoogleTest, libzip (its CMake config references the
# zipcmp/zipmerge/ziptool binaries, so they must be present), PCRE2 and ICU (tokenizer),
# nlohmann-json, Abseil; LAPACKE and yaml-cpp for `morserve convert` (LoRA SVD, MoR run configs).
PACKAGES=(
  cmake ninja-build g++ pkg-config
  libgtest-dev libgmock-dev
  libzip-dev zipcmp zipmerge ziptool
  libpcre2-dev libicu-dev nlohmann-json3-dev libabsl-dev
  liblapacke-dev libyaml-cpp-dev
  # Server, metrics and gateway (MORSERVE_SERVER): gRPC, Protobuf, prometheus-cpp, Boost.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libboost-dev
  # Tests only: a real Prometheus server scrapes /metrics (tests/server/server_prometheus_test);
  # openssl makes the TLS certificate of tests/server/server_transport_test.
  prometheus openssl
  docker-compose  # tests/deploy: `docker-compose config` validates deploy/docker-compose.yml
  curl  # tests/gateway: the HTTP client of the gateway's end-to-end test
  gnuplot-nox  # morserve-loadtest draws its SVG plots with gnuplot (loadtest/plots.cc)
  # Fuzzing and the sanitizer pass (scripts/fuzz.sh, scripts/sanitize.sh): clang with libFuzzer
  # and the sanitizer runtimes, llvm-symbolizer for readable stacks.
  clang libclang-rt-dev llvm
  # The style gate of CI (scripts/check_style.sh): clang-format and clang-tidy (14 on bookworm).
  clang-format clang-tidy
)

missing=()
for p in "${PACKAGES[@]}"; do
  # "install ok installed": dpkg -s alone also succeeds for removed packages that left config.
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] ||
    missing+=("$p")
done
# Node.js and npm for the tokenizer parity test (tests/tokenizer): Debian's packages, unless a
# node with npm is already installed some other way (NodeSource ships npm inside nodejs).
if ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
# kubectl for tests/deploy (`kubectl kustomize` of deploy/kubernetes): Debian's kubernetes-client,
# unless a kubectl is already installed some other way (it conflicts with other kubectl packages).
if ! command -v kubectl >/dev/null 2>&1; then
  missing+=(kubernetes-client)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${missing[*]}" >&2
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q "${missing[@]}"
