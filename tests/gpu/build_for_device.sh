#!/usr/bin/env bash
# Builds the GPU tests here (CUDA build dir, sm_90a) and fills .gpu-bin/ at the repository
# root (ignored by git through .git/info/exclude), ready to be carried to a GPU machine,
# whose image has the CUDA 13 runtime but none of the project's Debian packages:
#   - the kernel tests and kernel_bench (they need only libcudart / libcublasLt there),
#   - engine_gpu_test and the morserve CLI (mkmodel + bench --device cuda), which link the
#     engine's Debian libraries (abseil, ICU, ...): those are copied from ldd's
#     answer into .gpu-bin/libs.tgz (glibc, libstdc++ and the CUDA libraries excluded: the
#     device image has newer ones), unpacked there by run_on_device.sh.
# Binaries are stripped of debug info so the whole folder stays well under the 64 MiB that
# travels with a device call (about 45 MiB).
#   usage: [REUSE_BUILD=1] tests/gpu/build_for_device.sh [BUILD_DIR]     (default: build-cuda)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
build=${1:-$root/build-cuda}
cd "$root"
# An already configured CUDA build (the full build/ of ./test.sh, say) is reused as it is
# when REUSE_BUILD=1: no reconfigure, so its server stays on and nothing is rebuilt twice.
if [ "${REUSE_BUILD:-0}" != 1 ]; then
  cmake -S "$root" -B "$build" -G Ninja -DMORSERVE_CUDA=ON -DMORSERVE_CUDA_RUNNER=ON \
    -DMORSERVE_SERVER=OFF -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
fi
targets=()
for src in tests/gpu/kernel_*_test.cc; do
  case $src in *_emu_test.cc) continue ;; esac  # CPU-emulated: nothing to run on the device
  targets+=("$(basename "$src" .cc)")
done
targets+=(kernel_bench engine_gpu_test engine_gpu_recurrent_test)
cmake --build "$build" --target "${targets[@]}" morserve recurrent_prefill_bench -- -j2
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-bin/' "$exclude" 2>/dev/null || echo '/.gpu-bin/' >>"$exclude"
rm -rf .gpu-bin && mkdir -p .gpu-bin
for t in "${targets[@]}"; do strip --strip-debug -o ".gpu-bin/$t" "$build/tests/gpu/$t"; done
strip --strip-debug -o .gpu-bin/morserve "$build/server/morserve"
strip --strip-debug -o .gpu-bin/recurrent_prefill_bench "$build/tests/bench/recurrent_prefill_bench"
libs=$(mktemp -d)
mkdir -p "$libs/lib"
ldd .gpu-bin/engine_gpu_test .gpu-bin/morserve | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++* | libgcc_s* | libcuda* | libcublas*) ;;
      *) cp -L "$lib" "$libs/lib/" ;;
    esac
  done
tar czf .gpu-bin/libs.tgz -C "$libs" lib
rm -rf "$libs"
cp tests/gpu/run_on_device.sh .gpu-bin/
echo "copied ${#targets[@]} test/bench binaries, morserve and $(tar tzf .gpu-bin/libs.tgz | grep -c '\.so') libraries to $root/.gpu-bin ($(du -sh .gpu-bin | cut -f1))"
