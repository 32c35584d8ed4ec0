// Early-exit confidence kernel, shared by the CUDA launcher (exit_confidence.cu) and the CPU
// emulation test (tests/gpu/kernel_exit_confidence_emu_test.cc). Not a public header: the contract
// is in exit_confidence.cuh. Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/exit_confidence.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ExitConfidenceKernel(const T* __restrict__ logits, int64_t stride, int vocab,
                         const float* __restrict__ threshold, int32_t* exit, double* max_prob) {
  __shared__ float s_max[kWarps];
  __shared__ double s_sum[kWarps];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, LoadF32(row, i));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) s_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_max[w]);
  const double md = m;
  double sum = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    sum += exp(static_cast<double>(LoadF32(row, i)) - md);
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) s_sum[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += s_sum[w];
  const double prob = 1.0 / total;  // NaN when every logit is -inf or NaN: never exits
  exit[blockIdx.x] = prob >= static_cast<double>(threshold[blockIdx.x]) ? 1 : 0;
  if (max_prob != nullptr) max_prob[blockIdx.x] = prob;
}

}  // namespace
}  // namespace morserve::kernels
