// Vector loads of bf16 data shared by kernel bodies (paged attention, LoRA shrink). Compiled by
// nvcc, or on the CPU by kernels/emu/cuda_emu.h (MORSERVE_CUDA_EMU); include it after either.
#pragma once

#include <cstdint>

namespace morserve::kernels {

// Widens 8 bf16 values held in a 16-byte vector (element 2i in the low half of word i).
__device__ __forceinline__ void Widen8(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

}  // namespace morserve::kernels
