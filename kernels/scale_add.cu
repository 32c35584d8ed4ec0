// Gated residual add launcher and kernel; the contract is in scale_add.cuh.
#include <algorithm>

#include "kernels/common.cuh"
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

cudaError_t scale_add_forward(const ScaleAddParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0 || (p.b_dtype != DType::kF32 && p.b_dtype != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.h == nullptr || p.b == nullptr) return cudaErrorInvalidValue;
  const int64_t n = static_cast<int64_t>(p.rows) * p.dim;
  const auto grid =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  if (p.b_dtype == DType::kBF16) {
    ScaleAddKernel<uint16_t>
        <<<grid, kThreads, 0, stream>>>(p.h, static_cast<const uint16_t*>(p.b), p.scale, n, p.dim);
  } else {
    ScaleAddKernel<float>
        <<<grid, kThreads, 0, stream>>>(p.h, static_cast<const float*>(p.b), p.scale, n, p.dim);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
