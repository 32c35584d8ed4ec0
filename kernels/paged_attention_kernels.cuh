// Paged attention kernels (split and combine) and their argument block, shared by the CUDA
// launcher (paged_attention.cu) and the CPU emulation test (tests/gpu/
// kernel_paged_attention_emu_test.cc, which runs these same kernel bodies with one fiber per
// CUDA thread). Not a public header: the contract is in paged_attention.cuh. Everything here
// is in an anonymous namespace of morserve::kernels (one copy per including file).
//
// The per-tile arithmetic (query load, key lookup, scores, online softmax, acc fold) lives in
// kernels/attention_tile.cuh, the partials' layout, store and chunk-order combine in
// kernels/attention_combine.cuh; both are shared with the recurrent attention kernel. The
// warp fold's walk and merge (AttnWarpChunkKernel) are kernels/attention_warp_fold.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_combine.cuh"
#include "kernels/attention_tile.cuh"
#include "kernels/attention_warp_fold.cuh"
#include "kernels/paged_attention.cuh"

namespace morserve::kernels {
namespace {

// Everything the kernels read, passed by value: the tile fold's fields, then the split's.
struct Args : TileArgs {
  void* out;
  PartialArgs partials;  // the chunks' partials (attention_combine.cuh)
  int chunk_len;
  AttentionFold fold;
};

// A row's entry count (visible + extra) and chunk count, or ok = false for a faulty row.
struct RowInfo {
  int len;      // visible entries
  int total;    // len + (extra ? 1 : 0)
  int nchunks;  // >= 1 (a row with no entry has one empty chunk, which writes zeros)
  bool ok;
};

__device__ __forceinline__ RowInfo GetRow(const Args& a, int row) {
  RowInfo info;
  const int32_t begin = a.table_indptr[row];
  const int32_t end = a.table_indptr[row + 1];
  info.len = a.kv_len[row];
  info.total = info.len + (a.extra_k != nullptr ? 1 : 0);
  const int64_t capacity = static_cast<int64_t>(end - begin) * a.block_size;
  info.ok = begin >= 0 && end >= begin && info.len >= 0 && info.len <= capacity;
  info.nchunks = info.total <= 0 ? 1 : (info.total + a.chunk_len - 1) / a.chunk_len;
  info.ok = info.ok && info.nchunks <= a.partials.max_chunks;
  return info;
}

// What a split CTA (row, kv head, chunk) of either fold works on: keys [begin, end) of its row.
// Returns false when it has nothing to do: past the row's last chunk, or a faulty row (whose
// chunk-0 CTA writes the NaN output).
template <int HD, typename TO>
__device__ __forceinline__ bool ChunkSpan(const Args& a, RowInfo& info, int& begin, int& end,
                                          int tid) {
  const int row = blockIdx.x;
  const int chunk = blockIdx.z;
  info = GetRow(a, row);
  if (!info.ok) {
    if (chunk == 0) {
      TO* out_row = GroupRow<HD>(static_cast<TO*>(a.out), row, a.n_heads, blockIdx.y, a.group);
      for (int o = tid; o < a.group * HD; o += kThreads) StoreF32(out_row, o, QuietNan());
    }
    return false;
  }
  if (chunk >= info.nchunks) return false;
  begin = chunk * a.chunk_len;
  end = min(info.total, begin + a.chunk_len);
  return true;
}

// A split CTA's result from its chunk's (m, l, acc): the output itself when the row has one
// chunk, else the chunk's partial for the combine kernel.
template <int HD, typename TO>
__device__ __forceinline__ void StoreChunk(const Args& a, const RowInfo& info,
                                           const TileAcc<HD>& acc, const float* m, const float* l,
                                           bool bad, int tid) {
  const int row = blockIdx.x;
  const int kvh = blockIdx.y;
  if (info.nchunks == 1) {
    TO* out_row = GroupRow<HD>(static_cast<TO*>(a.out), row, a.n_heads, kvh, a.group);
    StoreNormalized<HD>(out_row, acc, l, a.group * HD, bad, /*nan_l_is_bad=*/false, tid);
    return;
  }
  StorePartial<HD>(a.partials, row, a.n_heads, kvh, a.group, blockIdx.z, acc, m, l, bad, tid);
}

// One CTA per (row, kv head, chunk), the CTA fold (AttentionFold::kCta). HD: head_dim; TO:
// float or uint16_t (bf16 bits). At least 3 CTAs per SM (kMinCtasPerSm): the pipelined fold's
// next-tile registers fit in 168 or fewer per thread without spills (ptxas -v, sm_90a), the
// occupancy the unpipelined fold had.
template <int HD, typename TO>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm) AttnChunkKernel(const Args a) {
  constexpr int kOutPerThread = TileShape<HD>::kOutPerThread;
  const int row = blockIdx.x;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int group = a.group;
  RowInfo info;
  int begin = 0, end = 0;
  if (!ChunkSpan<HD, TO>(a, info, begin, end, tid)) return;

  __shared__ TileShared<HD> sh;
  __shared__ int s_bad;
  GroupQuery qreg;
  LoadGroupQuery<HD>(GroupRow<HD>(a.q, row, a.n_heads, kvh, group), group, tid, qreg);
  if (tid < kMaxGroup) {
    sh.m[tid] = -INFINITY;
    sh.l[tid] = 0.0f;
    sh.corr[tid] = 1.0f;
  }
  if (tid == 0) s_bad = 0;
  TileAcc<HD> acc;
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) acc[i] = 0.0f;
  __syncthreads();

  const int32_t* blocks = a.table_blocks + a.table_indptr[row];
  FoldTiles<HD>(a, blocks, row, kvh, info.len, begin, end, qreg, sh, s_bad, acc, tid);
  StoreChunk<HD, TO>(a, info, acc, sh.m, sh.l, s_bad != 0, tid);
}

// The warp fold (AttentionFold::kWarp, attention_warp_fold.cuh): the same grid and chunks,
// each warp walking its own tiles of the chunk, merged in warp order before StoreChunk. At
// least kWarpFoldMinCtasPerSm CTAs per SM: 197-222 registers per thread, no spills (ptxas -v,
// sm_90a; at 3 CTAs per SM it spilled 24-424 bytes).
template <int HD, typename TO>
__global__ void __launch_bounds__(kThreads, kWarpFoldMinCtasPerSm)
    AttnWarpChunkKernel(const Args a) {
  const int row = blockIdx.x;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  RowInfo info;
  int begin = 0, end = 0;
  if (!ChunkSpan<HD, TO>(a, info, begin, end, tid)) return;

  __shared__ WarpFoldShared<HD> sh;
  __shared__ int s_bad;
  QueryBits q;  // kept as bf16 bits (widened when used): half the registers of GroupQuery
  LoadQueryBits<HD>(GroupRow<HD>(a.q, row, a.n_heads, kvh, a.group), a.group, lane, q);
  WarpFoldState<HD> st;
  ResetWarpState<HD>(st);
  if (tid == 0) s_bad = 0;
  __syncthreads();

  const int32_t* blocks = a.table_blocks + a.table_indptr[row];
  WarpFoldTiles<HD>(a, blocks, row, kvh, info.len, begin, end, q, sh.warp[warp], s_bad, st, warp,
                    lane);
  TileAcc<HD> acc;
  WarpMerge<HD>(a.group, st, sh, acc, warp, lane, tid);
  StoreChunk<HD, TO>(a, info, acc, sh.m_all, sh.l_all, s_bad != 0, tid);
}

// One CTA of HD threads per (row, head) whose row has several chunks: merges the chunk
// partials in chunk order.
template <int HD, typename TO>
__global__ void __launch_bounds__(HD) AttnCombineKernel(const Args a) {
  const int row = blockIdx.x;
  const int head = blockIdx.y;
  const int d = threadIdx.x;
  const RowInfo info = GetRow(a, row);
  if (!info.ok || info.nchunks <= 1) return;
  TO* out = static_cast<TO*>(a.out) + static_cast<int64_t>(row) * a.n_heads * HD +
            static_cast<int64_t>(head) * HD;
  StoreF32(out, d, CombineChunks<HD>(a.partials, row, a.n_heads, head, info.nchunks, d));
}

// The kernels' argument block for a validated launch (see paged_attention_forward).
inline Args MakeArgs(const PagedAttentionParams& p, int max_chunks) {
  Args a;
  FillTileArgs(p, a);
  a.out = p.out;
  a.partials = MakePartialArgs(p.workspace, p.rows, p.n_heads, p.head_dim, max_chunks);
  a.chunk_len = p.chunk_len;
  a.fold = p.fold;
  return a;
}

}  // namespace
}  // namespace morserve::kernels
