// Expert-choice router decision launcher; the kernel is in expert_router_kernels.cuh, the contract
// in expert_router.cuh.
#include "kernels/expert_router.cuh"
#include "kernels/expert_router_kernels.cuh"
#include "kernels/launch.cuh"

namespace morserve::kernels {

cudaError_t expert_router_forward(const ExpertRouterParams& p, cudaStream_t stream) {
  const bool linear = p.h != nullptr;
  if (p.rows < 0 || p.num_loops <= 0 || !(p.temperature > 0.0f) ||
      (p.w_dtype != DType::kF32 && p.w_dtype != DType::kBF16) ||
      (linear && (p.hidden <= 0 || p.score_in != nullptr || p.decide_in != nullptr)) ||
      (!linear && p.aux_w != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if ((linear && p.router_w == nullptr) || (!linear && p.score_in == nullptr) ||
      p.loops == nullptr || p.capacity == nullptr || p.active == nullptr || p.gate == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.w_dtype == DType::kBF16) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ExpertRouterKernel<uint16_t>)(p);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ExpertRouterKernel<float>)(p);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
