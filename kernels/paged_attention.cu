// Paged varlen attention launcher (validation, dispatch, the two launches); the kernels are
// in paged_attention_kernels.cuh, the contract in paged_attention.cuh.
#include <cmath>

#include "kernels/launch.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/paged_attention_kernels.cuh"

namespace morserve::kernels {
namespace {

template <int HD, typename TO>
cudaError_t Launch(const Args& a, int rows, int max_chunks, cudaStream_t stream) {
  if (a.fold == AttentionFold::kWarp) {
    MORSERVE_LAUNCH(dim3(rows, a.n_kv_heads, max_chunks), kThreads, 0, stream,
                    AttnWarpChunkKernel<HD, TO>)
    (a);
  } else {
    MORSERVE_LAUNCH(dim3(rows, a.n_kv_heads, max_chunks), kThreads, 0, stream,
                    AttnChunkKernel<HD, TO>)
    (a);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || max_chunks == 1) return err;
  MORSERVE_LAUNCH(dim3(rows, a.n_heads), HD, 0, stream, AttnCombineKernel<HD, TO>)(a);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int PagedAttentionMaxChunks(int max_kv_len, bool extra, int chunk_len) {
  if (chunk_len <= 0 || max_kv_len < 0) return 1;
  const int64_t total = static_cast<int64_t>(max_kv_len) + (extra ? 1 : 0);
  const int64_t chunks = (total + chunk_len - 1) / chunk_len;
  return chunks < 1 ? 1 : static_cast<int>(chunks);
}

size_t PagedAttentionWorkspaceFloats(int rows, int n_heads, int head_dim, int max_kv_len,
                                     bool extra, int chunk_len) {
  const int chunks = PagedAttentionMaxChunks(max_kv_len, extra, chunk_len);
  if (chunks <= 1 || rows <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
  return static_cast<size_t>(rows) * n_heads * chunks * (head_dim + 2);
}

cudaError_t paged_attention_forward(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.rows < 0 || !AttentionHeadDimSupported(p.head_dim) || p.n_heads <= 0 || p.n_kv_heads <= 0 ||
      p.n_heads % p.n_kv_heads != 0 || p.n_heads / p.n_kv_heads > kMaxGroup || p.block_size <= 0 ||
      p.num_blocks <= 0 || p.max_kv_len < 0 || p.chunk_len <= 0 || p.chunk_len % kTile != 0 ||
      !std::isfinite(p.scale) || (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) ||
      (p.extra_k == nullptr) != (p.extra_v == nullptr) ||
      (p.fold != AttentionFold::kCta && p.fold != AttentionFold::kWarp)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.q == nullptr || p.k_cache == nullptr || p.v_cache == nullptr || p.table_indptr == nullptr ||
      p.table_blocks == nullptr || p.kv_len == nullptr || p.out == nullptr) {
    return cudaErrorInvalidValue;
  }
  // 16-byte vector loads of q, K, V (head_dim * 2 bytes keeps every row aligned).
  if (!Aligned16(p.q) || !Aligned16(p.k_cache) || !Aligned16(p.v_cache) || !Aligned16(p.extra_k) ||
      !Aligned16(p.extra_v)) {
    return cudaErrorInvalidValue;
  }
  const bool extra = p.extra_k != nullptr;
  const int max_chunks = PagedAttentionMaxChunks(p.max_kv_len, extra, p.chunk_len);
  if (max_chunks > 65535 || p.n_kv_heads > 65535 || p.n_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  if (max_chunks > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;

  const Args a = MakeArgs(p, max_chunks);
  const bool bf16 = p.out_dtype == DType::kBF16;
  switch (p.head_dim) {
    case 64:
      return bf16 ? Launch<64, uint16_t>(a, p.rows, max_chunks, stream)
                  : Launch<64, float>(a, p.rows, max_chunks, stream);
    case 96:
      return bf16 ? Launch<96, uint16_t>(a, p.rows, max_chunks, stream)
                  : Launch<96, float>(a, p.rows, max_chunks, stream);
    default:  // 128
      return bf16 ? Launch<128, uint16_t>(a, p.rows, max_chunks, stream)
                  : Launch<128, float>(a, p.rows, max_chunks, stream);
  }
}

}  // namespace morserve::kernels
