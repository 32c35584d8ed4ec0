// Gated residual add launcher; the kernel is in scale_add_kernels.cuh, the contract in
// scale_add.cuh.
#include "kernels/launch.cuh"
#include "kernels/scale_add.cuh"
#include "kernels/scale_add_kernels.cuh"

namespace morserve::kernels {

cudaError_t scale_add_forward(const ScaleAddParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0 || (p.b_dtype != DType::kF32 && p.b_dtype != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.h == nullptr || p.b == nullptr) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(p.rows) * p.dim;
  const unsigned grid = GridStrideBlocks(n, kThreads, kMaxBlocks);
  if (p.b_dtype == DType::kBF16) {
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, ScaleAddKernel<uint16_t>)
    (p.h, static_cast<const uint16_t*>(p.b), p.scale, n, p.dim);
  } else {
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, ScaleAddKernel<float>)
    (p.h, static_cast<const float*>(p.b), p.scale, n, p.dim);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
