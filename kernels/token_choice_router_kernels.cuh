// Token-choice router kernel, shared by the CUDA launcher (token_choice_router.cu) and the CPU
// emulation test (tests/gpu/kernel_token_choice_router_emu_test.cc). Not a public header: the
// contract is in token_choice_router.cuh. Everything is in an anonymous namespace of
// morserve::kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/device_helpers.cuh"
#include "kernels/token_choice_router.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRec = kTokenChoiceMaxRecursions;

template <typename TW>
__global__ void __launch_bounds__(kThreads) TokenChoiceKernel(TokenChoiceRouterParams p) {
  __shared__ float scratch[kWarps];
  const int row = blockIdx.x;
  const int nr = p.num_recursions;
  float s[kMaxRec];
  if (p.h != nullptr) {
    const float* x = p.h + static_cast<int64_t>(row) * p.hidden;
    for (int j = 0; j < nr; ++j) {
      const TW* w = static_cast<const TW*>(p.router_w) + static_cast<int64_t>(j) * p.hidden;
      float part = 0.0f;
      for (int i = threadIdx.x; i < p.hidden; i += kThreads) part = fmaf(x[i], LoadF32(w, i), part);
      s[j] = BlockSum<kWarps>(part, scratch);
    }
  } else {
    for (int j = 0; j < nr; ++j) s[j] = p.scores_in[static_cast<int64_t>(row) * nr + j];
  }
  if (threadIdx.x != 0) return;
  double prob[kMaxRec];
  if (p.activation == TokenChoiceActivation::kSigmoid) {
    for (int j = 0; j < nr; ++j)
      prob[j] = static_cast<double>(p.alpha) * (1.0 / (1.0 + exp(-static_cast<double>(s[j]))));
  } else {
    float m = s[0];
    for (int j = 1; j < nr; ++j) m = fmaxf(m, s[j]);
    double sum = 0.0;
    for (int j = 0; j < nr; ++j) sum += exp(static_cast<double>(s[j]) - m);
    for (int j = 0; j < nr; ++j) {
      prob[j] = static_cast<double>(p.alpha) * exp(static_cast<double>(s[j]) - m) / sum;
    }
  }
  int best = 0;
  auto biased = [&](int j) {
    return prob[j] + (p.bias == nullptr ? 0.0 : static_cast<double>(p.bias[j]));
  };
  for (int j = 1; j < nr; ++j) {
    if (biased(j) > biased(best)) best = j;
  }
  p.depth[row] = best + 1;
  p.gate[row] = __double2float_rn(prob[best]);
  if (p.scores_out != nullptr) {
    for (int j = 0; j < nr; ++j) p.scores_out[static_cast<int64_t>(row) * nr + j] = s[j];
  }
}

}  // namespace
}  // namespace morserve::kernels
