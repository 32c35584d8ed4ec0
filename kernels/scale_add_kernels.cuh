// Gated residual add kernel, shared by the CUDA launcher (scale_add.cu) and the CPU emulation test
// (tests/gpu/kernel_scale_add_emu_test.cc). Not a public header: the contract is in scale_add.cuh.
// Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/scale_add.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;

// Grid-stride over the rows * dim elements.
template <typename TB>
__global__ void __launch_bounds__(kThreads)
    ScaleAddKernel(float* __restrict__ h, const TB* __restrict__ b, const float* __restrict__ scale,
                   int64_t n, int dim) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const double s = scale == nullptr ? 1.0 : static_cast<double>(scale[e / dim]);
    const double sum =
        __dadd_rn(static_cast<double>(h[e]), __dmul_rn(s, static_cast<double>(LoadF32(b, e))));
    h[e] = __double2float_rn(sum);
  }
}

}  // namespace
}  // namespace morserve::kernels
