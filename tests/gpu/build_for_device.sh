#!/usr/bin/env bash
# Builds the kernel tests here (CUDA build dir, sm_90a) and copies the binaries into
# .gpu-bin/ at the repository root (ignored by git through .git/info/exclude), ready to be
# carried to a GPU machine, whose image has the CUDA 13 runtime but none of the project's
# Debian packages (the test binaries need only libcudart / libcublasLt there).
#   usage: tests/gpu/build_for_device.sh [BUILD_DIR]     (default: build-cuda)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
build=${1:-$root/build-cuda}
cd "$root"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DMORSERVE_CUDA=ON -DMORSERVE_SERVER=OFF \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
targets=()
for src in tests/gpu/kernel_*_test.cc; do
  case $src in *_emu_test.cc) continue ;; esac  # CPU-emulated: nothing to run on the device
  targets+=("$(basename "$src" .cc)")
done
targets+=(kernel_bench)
cmake --build "$build" --target "${targets[@]}" -- -j2
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-bin/' "$exclude" 2>/dev/null || echo '/.gpu-bin/' >>"$exclude"
rm -rf .gpu-bin && mkdir -p .gpu-bin
for t in "${targets[@]}"; do cp "$build/tests/gpu/$t" .gpu-bin/; done
cp tests/gpu/run_on_device.sh .gpu-bin/
echo "copied ${#targets[@]} binaries (tests and kernel_bench) to $root/.gpu-bin"
