// Greedy argmax kernel, shared by the CUDA launcher (argmax.cu) and the CPU emulation test
// (tests/gpu/kernel_argmax_emu_test.cc). Not a public header: the contract is in argmax.cuh.
// Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/argmax.cuh"
#include "kernels/device_helpers.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct Best {
  float value;
  int index;
};

// True when a beats b: larger value, or the same value at a smaller index. NaN never beats
// anything, and anything that is not NaN beats a NaN candidate.
__device__ __forceinline__ bool Beats(const Best& a, const Best& b) {
  if (isnan(a.value)) return false;
  if (isnan(b.value)) return true;
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

__device__ __forceinline__ Best WarpBest(Best b) {
  for (int off = 16; off > 0; off >>= 1) {
    Best other;
    other.value = __shfl_xor_sync(0xffffffffu, b.value, off);
    other.index = __shfl_xor_sync(0xffffffffu, b.index, off);
    if (Beats(other, b)) b = other;
  }
  return b;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const T* __restrict__ logits, int64_t stride, int vocab, int32_t* token,
                 float* max_logit) {
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  Best b{__int_as_float(0x7fc00000), 0};
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const Best c{LoadF32(row, i), i};
    if (Beats(c, b)) b = c;
  }
  b = WarpBest(b);
  __shared__ Best warp_best[kWarps];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = b;
  __syncthreads();
  if (threadIdx.x < 32) {
    Best c = threadIdx.x < kWarps ? warp_best[threadIdx.x] : Best{__int_as_float(0x7fc00000), 0};
    c = WarpBest(c);
    if (threadIdx.x == 0) {
      token[blockIdx.x] = c.index;
      if (max_logit != nullptr) max_logit[blockIdx.x] = c.value;
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
