// KV cache entry copies, launcher and kernel; the contract is in kv_copy.cuh.
#include "kernels/common.cuh"
#include "kernels/kv_copy.cuh"
#include "kernels/launch.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;

// One copy of one pool; T is uint4 (8 bf16) or uint16_t, `width` entries of T per slot.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    KvCopyKernel(T* __restrict__ k_cache, T* __restrict__ v_cache,
                 const int32_t* __restrict__ copies, int64_t width, int64_t slots, T nan) {
  T* pool = blockIdx.y == 0 ? k_cache : v_cache;
  const int64_t src = copies[3 * blockIdx.x], dst = copies[3 * blockIdx.x + 1],
                count = copies[3 * blockIdx.x + 2];  // widened: slot + count stays exact
  if (count <= 0 || dst < 0 || dst + count > slots) return;
  T* out = pool + dst * width;
  const int64_t total = count * width;
  if (src < 0 || src + count > slots) {
    for (int64_t i = threadIdx.x; i < total; i += kThreads) out[i] = nan;
    return;
  }
  const T* in = pool + src * width;
  for (int64_t i = threadIdx.x; i < total; i += kThreads) out[i] = in[i];
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t kv_copy_forward(const KvCopyParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.kv_dim <= 0 || p.slots <= 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (p.k_cache == nullptr || p.v_cache == nullptr || p.copies == nullptr)
    return cudaErrorInvalidValue;
  const dim3 grid(p.n, 2);
  if (p.kv_dim % 8 == 0 && Aligned16(p.k_cache) && Aligned16(p.v_cache)) {
    const uint32_t nan2 = 0x7fc07fc0u;  // two bf16 quiet NaNs
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, KvCopyKernel<uint4>)
    (reinterpret_cast<uint4*>(p.k_cache), reinterpret_cast<uint4*>(p.v_cache), p.copies,
     p.kv_dim / 8, p.slots, make_uint4(nan2, nan2, nan2, nan2));
  } else {
    MORSERVE_LAUNCH(grid, kThreads, 0, stream, KvCopyKernel<uint16_t>)
    (p.k_cache, p.v_cache, p.copies, p.kv_dim, p.slots, static_cast<uint16_t>(0x7fc0));
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
