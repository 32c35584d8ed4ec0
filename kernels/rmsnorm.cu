// RMSNorm launcher and kernel; the contract is in rmsnorm.cuh.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/rmsnorm.cuh"

namespace morserve::kernels {
namespace {

// Fixed for every launch: the reduction tree (and so the bits) must not depend on the batch.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// TX, TW, TO: float, or uint16_t holding bf16 bits. Grid: one CTA per row.
template <typename TX, typename TW, typename TO, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(const TX* x, const TW* __restrict__ w, float* residual, TO* out, int dim,
                  float eps) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;

  // Pass 1: each thread sums the squares of elements tid, tid + kThreads, ... in that order.
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    float h = LoadF32(x, base + i);
    if constexpr (kResidual) {
      h += residual[base + i];
      residual[base + i] = h;
    }
    ss = fmaf(h, h, ss);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    ss += __shfl_xor_sync(0xffffffffu, ss, offset);
  }
  __shared__ float warp_sums[kWarps];
  __shared__ float inv_shared;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int k = 0; k < kWarps; ++k) total += warp_sums[k];  // warp order, fixed
    inv_shared = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  }
  __syncthreads();
  const float inv = inv_shared;

  // Pass 2: the same thread revisits the same elements, so out may alias x and the residual
  // written above is visible without a barrier.
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float h = kResidual ? residual[base + i] : LoadF32(x, base + i);
    StoreF32(out, base + i, LoadF32(w, i) * (h * inv));
  }
}

template <typename TX, typename TW, typename TO>
cudaError_t Launch(const RmsNormParams& p, cudaStream_t stream) {
  const auto* x = static_cast<const TX*>(p.x);
  const auto* w = static_cast<const TW*>(p.weight);
  auto* out = static_cast<TO*>(p.out);
  if (p.residual != nullptr) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, RmsNormKernel<TX, TW, TO, true>)
    (x, w, p.residual, out, p.dim, p.eps);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, RmsNormKernel<TX, TW, TO, false>)
    (x, w, nullptr, out, p.dim, p.eps);
  }
  return cudaGetLastError();
}

bool Supported(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// Turns the three run-time dtypes into template arguments, one level at a time.
template <typename... Ts>
cudaError_t Dispatch(const RmsNormParams& p, cudaStream_t stream) {
  constexpr size_t kBound = sizeof...(Ts);
  if constexpr (kBound == 3) {
    return Launch<Ts...>(p, stream);
  } else {
    const DType t = kBound == 0 ? p.x_dtype : kBound == 1 ? p.weight_dtype : p.out_dtype;
    if (t == DType::kBF16) return Dispatch<Ts..., uint16_t>(p, stream);
    return Dispatch<Ts..., float>(p, stream);
  }
}

}  // namespace

cudaError_t rmsnorm_forward(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0 || !Supported(p.x_dtype) || !Supported(p.weight_dtype) ||
      !Supported(p.out_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  return Dispatch<>(p, stream);
}

}  // namespace morserve::kernels
