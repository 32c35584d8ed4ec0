// Expert-choice router kernel, shared by the CUDA launcher (expert_router.cu) and the CPU emulation
// test (tests/gpu/kernel_expert_router_emu_test.cc). Not a public header: the contract is in
// expert_router.cuh. Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/device_helpers.cuh"
#include "kernels/expert_router.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// w_row · (h_row / temperature) with the fixed order described in the header.
template <typename TW>
__device__ float RouterDot(const float* h_row, const TW* w_row, int hidden, float temperature,
                           float* scratch) {
  float part = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    part = fmaf(__fdiv_rn(h_row[i], temperature), LoadF32(w_row, i), part);
  }
  return BlockSum<kWarps>(part, scratch);
}

template <typename TW>
__global__ void __launch_bounds__(kThreads) ExpertRouterKernel(ExpertRouterParams p) {
  __shared__ float scratch[kWarps];
  const int row = blockIdx.x;
  const int loop = p.loops[row];
  if (loop < 0 || loop >= p.num_loops) {  // uniform over the CTA
    if (threadIdx.x == 0) {
      p.active[row] = 0;
      p.gate[row] = __int_as_float(0x7fc00000);
      if (p.score_out != nullptr) p.score_out[row] = __int_as_float(0x7fc00000);
    }
    return;
  }
  float score, decide;
  if (p.h != nullptr) {
    const float* h_row = p.h + static_cast<int64_t>(row) * p.hidden;
    const int64_t w_off = static_cast<int64_t>(loop) * p.hidden;
    score = RouterDot(h_row, static_cast<const TW*>(p.router_w) + w_off, p.hidden, p.temperature,
                      scratch);
    decide = p.aux_w == nullptr ? score
                                : RouterDot(h_row, static_cast<const TW*>(p.aux_w) + w_off,
                                            p.hidden, p.temperature, scratch);
  } else {
    score = p.score_in[row];
    decide = p.decide_in == nullptr ? score : p.decide_in[row];
  }
  if (threadIdx.x != 0) return;
  const bool active = p.capacity[loop] >= 1.0f || decide > p.threshold;
  const double s = score;
  const double act = p.activation == GateActivation::kTanh ? tanh(s) : 1.0 / (1.0 + exp(-s));
  p.active[row] = active ? 1 : 0;
  p.gate[row] = __double2float_rn(static_cast<double>(p.alpha) * act);
  if (p.score_out != nullptr) p.score_out[row] = score;
}

}  // namespace
}  // namespace morserve::kernels
