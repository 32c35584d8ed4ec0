// SwiGLU kernel, shared by the CUDA launcher (swiglu.cu) and the CPU emulation test
// (tests/gpu/kernel_swiglu_emu_test.cc). Not a public header: the contract is in swiglu.cuh.
// Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/swiglu.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;

// Grid-stride over the rows * inter outputs, one element per thread and step.
template <typename TI, typename TO>
__global__ void __launch_bounds__(kThreads)
    SwigluKernel(const TI* __restrict__ gate_up, TO* __restrict__ out, int64_t n, int inter) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = e / inter;
    const int64_t i = e % inter;
    const TI* in = gate_up + row * 2 * inter;
    const float g = LoadF32(in, i);
    const float u = LoadF32(in, inter + i);
    const float silu = __fdiv_rn(g, 1.0f + expf(-g));
    StoreF32(out, e, __fmul_rn(silu, u));
  }
}

}  // namespace
}  // namespace morserve::kernels
