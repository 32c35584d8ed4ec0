// Huginn's joined adapter input, launcher and kernel; the contract is in state_join.cuh.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/state_join.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 4096;  // the grid-stride loop over rows covers the rest
constexpr uint16_t kBf16Nan = 0x7FC0;

// One half of output row i: bf16 of state row `r`, or NaN when r is outside the pool.
__device__ void JoinHalf(const float* __restrict__ states, int64_t capacity, int64_t r, int dim,
                         uint16_t* __restrict__ out) {
  const bool valid = r >= 0 && r < capacity;
  const float* in = states + (valid ? r : 0) * dim;
  for (int j = threadIdx.x; j < dim; j += kThreads) {
    out[j] = valid ? F32ToBf16Bits(in[j]) : kBf16Nan;
  }
}

__global__ void __launch_bounds__(kThreads)
    StateJoinKernel(const float* __restrict__ states, int64_t capacity,
                    const int32_t* __restrict__ s_rows, const int32_t* __restrict__ e_rows,
                    uint16_t* __restrict__ out, int n, int dim) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    uint16_t* row = out + i * 2 * dim;
    JoinHalf(states, capacity, s_rows[i], dim, row);
    JoinHalf(states, capacity, e_rows[i], dim, row + dim);
  }
}

}  // namespace

cudaError_t state_join_forward(const StateJoinParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.dim <= 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (p.states == nullptr || p.s_rows == nullptr || p.e_rows == nullptr || p.out == nullptr ||
      p.capacity < 1) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.n, kMaxBlocks));
  MORSERVE_LAUNCH(grid, kThreads, 0, stream, StateJoinKernel)
  (p.states, p.capacity, p.s_rows, p.e_rows, p.out, p.n, p.dim);
  return cudaGetLastError();
}

}  // namespace morserve::kernels
