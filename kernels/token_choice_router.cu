// Token-choice router decision launcher and kernel; the contract is in token_choice_router.cuh.
#include "kernels/common.cuh"
#include "kernels/token_choice_router.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRec = kTokenChoiceMaxRecursions;

// Sum over the CTA: shuffle tree, then warps in order; every thread gets the result.
__device__ float BlockSum(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

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
      s[j] = BlockSum(part, scratch);
    }
  } else {
    for (int j = 0; j < nr; ++j) s[j] = p.scores_in[static_cast<int64_t>(row) * nr + j];
  }
  if (threadIdx.x != 0) return;
  double prob[kMaxRec];
  if (p.activation == TokenChoiceActivation::kSigmoid) {
    for (int j = 0; j < nr; ++j) prob[j] = static_cast<double>(p.alpha) * (1.0 / (1.0 + exp(-static_cast<double>(s[j]))));
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
  auto biased = [&](int j) { return prob[j] + (p.bias == nullptr ? 0.0 : static_cast<double>(p.bias[j])); };
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

cudaError_t token_choice_router_forward(const TokenChoiceRouterParams& p, cudaStream_t stream) {
  const bool linear = p.h != nullptr;
  if (p.rows < 0 || p.num_recursions < 1 || p.num_recursions > kMaxRec ||
      (p.w_dtype != DType::kF32 && p.w_dtype != DType::kBF16) ||
      (linear && (p.hidden <= 0 || p.scores_in != nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if ((linear && p.router_w == nullptr) || (!linear && p.scores_in == nullptr) ||
      p.depth == nullptr || p.gate == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.w_dtype == DType::kBF16) {
    TokenChoiceKernel<uint16_t><<<p.rows, kThreads, 0, stream>>>(p);
  } else {
    TokenChoiceKernel<float><<<p.rows, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
