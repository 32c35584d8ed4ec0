// fp32 row copies, launcher and kernel; the contract is in row_copy.cuh.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/row_copy.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 4096;  // the grid-stride loop over rows covers the rest

// Row i of the launch: its CTA copies `width` V (float4, or float when dim is not a multiple
// of 4) from src row src_rows[i] (or i) to dst row dst_rows[i] (or i), nothing when either is
// outside its buffer.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    RowCopyKernel(const V* __restrict__ src, V* __restrict__ dst,
                  const int32_t* __restrict__ src_rows, const int32_t* __restrict__ dst_rows,
                  int64_t src_capacity, int64_t dst_capacity, int n, int width) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t s = src_rows == nullptr ? i : src_rows[i];
    const int64_t d = dst_rows == nullptr ? i : dst_rows[i];
    if (s < 0 || s >= src_capacity || d < 0 || d >= dst_capacity) continue;
    const V* in = src + s * width;
    V* out = dst + d * width;
    for (int j = threadIdx.x; j < width; j += kThreads) out[j] = in[j];
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t row_copy_forward(const RowCopyParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.dim <= 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (p.src == nullptr || p.dst == nullptr || p.src_capacity < 1 || p.dst_capacity < 1) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.n, kMaxBlocks));
  if (p.dim % 4 == 0 && Aligned16(p.src) && Aligned16(p.dst)) {
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, RowCopyKernel<float4>)
    (reinterpret_cast<const float4*>(p.src), reinterpret_cast<float4*>(p.dst), p.src_rows,
     p.dst_rows, p.src_capacity, p.dst_capacity, p.n, p.dim / 4);
  } else {
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, RowCopyKernel<float>)
    (p.src, p.dst, p.src_rows, p.dst_rows, p.src_capacity, p.dst_capacity, p.n, p.dim);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
