// SwiGLU launcher; the kernel is in swiglu_kernels.cuh, the contract in swiglu.cuh.
#include "kernels/launch.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/swiglu_kernels.cuh"

namespace morserve::kernels {
namespace {

template <typename TI, typename TO>
cudaError_t Launch(const SwigluParams& p, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(p.rows) * p.inter;
  const unsigned blocks = GridStrideBlocks(n, kThreads, kMaxBlocks);
  MORSERVE_LAUNCH(blocks, kThreads, 0, stream, SwigluKernel<TI, TO>)
  (static_cast<const TI*>(p.gate_up), static_cast<TO*>(p.out), n, p.inter);
  return cudaGetLastError();
}

bool Supported(DType t) { return t == DType::kF32 || t == DType::kBF16; }

}  // namespace

cudaError_t swiglu_forward(const SwigluParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.inter <= 0 || !Supported(p.in_dtype) || !Supported(p.out_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.gate_up == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  const bool in_bf16 = p.in_dtype == DType::kBF16, out_bf16 = p.out_dtype == DType::kBF16;
  if (in_bf16) {
    return out_bf16 ? Launch<uint16_t, uint16_t>(p, stream) : Launch<uint16_t, float>(p, stream);
  }
  return out_bf16 ? Launch<float, uint16_t>(p, stream) : Launch<float, float>(p, stream);
}

}  // namespace morserve::kernels
