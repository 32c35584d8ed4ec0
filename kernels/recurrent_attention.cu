// Recurrent attention launchers (validation, dispatch); the kernel body is in
// recurrent_attention_kernels.cuh, the contract in recurrent_attention.cuh.
#include <cmath>

#include "kernels/launch.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/recurrent_attention.cuh"
#include "kernels/recurrent_attention_kernels.cuh"

namespace morserve::kernels {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

cudaError_t Validate(const RecurrentAttentionParams& p, bool finish) {
  if (p.num_items < 0 || p.rows < 0 || !AttentionHeadDimSupported(p.head_dim) || p.n_heads <= 0 ||
      p.n_kv_heads <= 0 || p.n_heads % p.n_kv_heads != 0 || p.n_heads / p.n_kv_heads > kMaxGroup ||
      p.block_size <= 0 || p.num_blocks <= 0 || !std::isfinite(p.scale) ||
      (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) || p.n_kv_heads > 65535 ||
      p.max_kv_len < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.num_items == 0) return cudaSuccess;
  if (p.q == nullptr || p.k_cache == nullptr || p.v_cache == nullptr || p.table_indptr == nullptr ||
      p.table_blocks == nullptr || p.kv_len == nullptr || p.workspace == nullptr ||
      p.items == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (finish && (p.extra_k == nullptr || p.extra_v == nullptr || p.out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(p.q) || !Aligned16(p.k_cache) || !Aligned16(p.v_cache) || !Aligned16(p.extra_k) ||
      !Aligned16(p.extra_v)) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

template <int HD, bool kFinish, typename TO>
cudaError_t Launch(const RecurrentAttentionParams& p, cudaStream_t stream) {
  const RecurrentArgs a = MakeRecurrentArgs(p);
  MORSERVE_LAUNCH(dim3(p.num_items, p.n_kv_heads), kThreads, 0, stream,
                  RecurrentFoldKernel<HD, kFinish, TO>)
  (a);
  return cudaGetLastError();
}

template <int HD, bool kFinish>
cudaError_t LaunchHeadDim(const RecurrentAttentionParams& p, cudaStream_t stream) {
  if constexpr (!kFinish) {  // a merge writes no output: one instantiation per head_dim
    return Launch<HD, false, float>(p, stream);
  } else {
    return p.out_dtype == DType::kBF16 ? Launch<HD, true, uint16_t>(p, stream)
                                       : Launch<HD, true, float>(p, stream);
  }
}

template <bool kFinish>
cudaError_t Dispatch(const RecurrentAttentionParams& p, cudaStream_t stream) {
  if (cudaError_t e = Validate(p, kFinish); e != cudaSuccess || p.num_items == 0) return e;
  switch (p.head_dim) {
    case 64:
      return LaunchHeadDim<64, kFinish>(p, stream);
    case 96:
      return LaunchHeadDim<96, kFinish>(p, stream);
    default:  // 128
      return LaunchHeadDim<128, kFinish>(p, stream);
  }
}

}  // namespace

int RecurrentAttentionMaxRanges(int max_kv_len) {
  return PagedAttentionMaxChunks(max_kv_len, /*extra=*/true, kRecurrentRange);
}

size_t RecurrentAttentionWorkspaceFloats(int rows, int n_heads, int head_dim, int max_kv_len) {
  if (rows <= 0 || n_heads <= 0 || head_dim <= 0 || max_kv_len < 0) return 0;
  return static_cast<size_t>(rows) * n_heads * RecurrentAttentionMaxRanges(max_kv_len) *
         (head_dim + 2);
}

cudaError_t recurrent_attention_merge(const RecurrentAttentionParams& p, cudaStream_t stream) {
  return Dispatch<false>(p, stream);
}

cudaError_t recurrent_attention_finish(const RecurrentAttentionParams& p, cudaStream_t stream) {
  return Dispatch<true>(p, stream);
}

}  // namespace morserve::kernels
