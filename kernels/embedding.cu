// Embedding gather launcher and kernel; the contract is in embedding.cuh.
#include "kernels/common.cuh"
#include "kernels/embedding.cuh"
#include "kernels/launch.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 128;

template <typename TO>
__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const uint16_t* __restrict__ table, const int32_t* __restrict__ ids,
                    TO* __restrict__ out, int dim, int64_t vocab, double scale) {
  const int64_t id = ids[blockIdx.x];
  TO* row_out = out + static_cast<int64_t>(blockIdx.x) * dim;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < dim; i += kThreads)
      StoreF32(row_out, i, __int_as_float(0x7fc00000));
    return;
  }
  const uint16_t* row = table + id * dim;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float x = Bf16BitsToF32(row[i]);
    StoreF32(row_out, i, scale == 1.0 ? x : static_cast<float>(static_cast<double>(x) * scale));
  }
}

// bf16 -> bf16 with 16-byte vectors (8 elements); dim % 8 == 0 and both bases aligned.
__global__ void __launch_bounds__(kThreads)
    EmbeddingCopyVec(const uint4* __restrict__ table, const int32_t* __restrict__ ids,
                     uint4* __restrict__ out, int dim_vec, int64_t vocab) {
  const int64_t id = ids[blockIdx.x];
  uint4* row_out = out + static_cast<int64_t>(blockIdx.x) * dim_vec;
  if (id < 0 || id >= vocab) {
    const uint32_t nan2 = 0x7fc07fc0u;  // two bf16 quiet NaNs
    for (int i = threadIdx.x; i < dim_vec; i += kThreads)
      row_out[i] = make_uint4(nan2, nan2, nan2, nan2);
    return;
  }
  const uint4* row = table + id * dim_vec;
  for (int i = threadIdx.x; i < dim_vec; i += kThreads) row_out[i] = row[i];
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t embedding_forward(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0 || p.vocab <= 0 ||
      (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) ||
      (p.out_dtype != DType::kF32 && p.scale != 1.0)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.table == nullptr || p.ids == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  if (p.out_dtype == DType::kF32) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, EmbeddingKernel<float>)
    (p.table, p.ids, static_cast<float*>(p.out), p.dim, p.vocab, p.scale);
  } else if (p.dim % 8 == 0 && Aligned16(p.table) && Aligned16(p.out)) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, EmbeddingCopyVec)
    (reinterpret_cast<const uint4*>(p.table), p.ids, static_cast<uint4*>(p.out), p.dim / 8,
     p.vocab);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, EmbeddingKernel<uint16_t>)
    (p.table, p.ids, static_cast<uint16_t*>(p.out), p.dim, p.vocab, 1.0);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
