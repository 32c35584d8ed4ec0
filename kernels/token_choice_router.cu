// Token-choice router decision launcher; the kernel is in token_choice_router_kernels.cuh, the
// contract in token_choice_router.cuh.
#include "kernels/launch.cuh"
#include "kernels/token_choice_router.cuh"
#include "kernels/token_choice_router_kernels.cuh"

namespace morserve::kernels {

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
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, TokenChoiceKernel<uint16_t>)(p);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, TokenChoiceKernel<float>)(p);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
