// Recurrent attention kernel body (merge and finish) and its argument block, shared by the
// CUDA launcher (recurrent_attention.cu) and the CPU emulation test
// (tests/gpu/kernel_recurrent_attention_emu_test.cc). Not a public header: the contract is in
// recurrent_attention.cuh. Its tile fold is kernels/attention_tile.cuh's FoldTiles and its
// partials' store, load and combine are kernels/attention_combine.cuh's, the code paged
// attention's split and combine kernels run, so a row equals paged attention with chunk_len
// kRecurrentRange bit for bit (the tests compare the two).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_combine.cuh"
#include "kernels/attention_tile.cuh"
#include "kernels/paged_attention_kernels.cuh"  // Args: the emulator test compares with it
#include "kernels/recurrent_attention.cuh"

namespace morserve::kernels {
namespace {

static_assert(kRecurrentTile == kTile, "recurrent folds use the paged attention tile");
static_assert(kRecurrentRange % kTile == 0, "ranges are whole tiles");

// Everything the kernels read, passed by value: the tile fold's fields, then the partials'.
struct RecurrentArgs : TileArgs {
  PartialArgs partials;  // max_chunks = ranges per row
  const RecurrentFoldItem* items;
  void* out;
  int rows;
};

inline RecurrentArgs MakeRecurrentArgs(const RecurrentAttentionParams& p) {
  RecurrentArgs a;
  FillTileArgs(p, a);
  a.partials = MakePartialArgs(p.workspace, p.rows, p.n_heads, p.head_dim,
                               RecurrentAttentionMaxRanges(p.max_kv_len));
  a.items = p.items;
  a.out = p.out;
  a.rows = p.rows;
  return a;
}

// What one CTA folds: keys [begin, end) into range `range`'s partial (opened empty when `fresh`,
// else loaded), ok = false for a fault (nothing folded, the partial poisoned).
struct FoldSpan {
  int begin, end, range;
  bool fresh, ok;
};

// The merge item's fold: inside one range, tile-aligned, non-empty, before the row's own tile.
__device__ __forceinline__ FoldSpan MergeFold(const RecurrentFoldItem& item, int own_tile,
                                              int max_ranges, bool row_ok) {
  FoldSpan f;
  f.begin = item.key_begin;
  f.end = item.key_end;
  const int range = f.begin >= 0 ? f.begin / kRecurrentRange : -1;
  f.ok = row_ok && range >= 0 && range < max_ranges && f.begin % kTile == 0 && f.end % kTile == 0 &&
         f.begin < f.end && f.end <= own_tile && f.end <= (range + 1) * kRecurrentRange;
  f.range = range >= 0 && range < max_ranges ? range : 0;  // where a fault is recorded
  f.fresh = !f.ok || f.begin % kRecurrentRange == 0;
  return f;
}

// The finish's fold: the own tile [len - len % tile, len] (entry len is the extra pair) into the
// own range's partial, opened empty when no merged tile precedes it in the range.
__device__ __forceinline__ FoldSpan FinishFold(int len, int own_tile, int max_ranges, bool row_ok) {
  FoldSpan f;
  f.begin = own_tile;
  f.end = len + 1;
  f.range = row_ok ? len / kRecurrentRange : 0;
  f.ok = row_ok && f.range < max_ranges;
  if (!f.ok) f.range = 0;
  f.fresh = !f.ok || own_tile % kRecurrentRange == 0;
  return f;
}

// One CTA per (item, kv head). kFinish: the finish launch (own tile + extra pair, then the
// output); otherwise a merge (partial in, partial out). TO: output type (finish only). At
// least kMinCtasPerSm CTAs per SM, as the split kernel.
template <int HD, bool kFinish, typename TO>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    RecurrentFoldKernel(const RecurrentArgs a) {
  const RecurrentFoldItem item = a.items[blockIdx.x];
  const int row = item.row;
  if (row < 0 || row >= a.rows) return;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int group = a.group;
  const int outs = group * HD;

  // The row's entries and this launch's key range.
  const int32_t ib = a.table_indptr[row];
  const int32_t ie = a.table_indptr[row + 1];
  const int len = a.kv_len[row];
  const int own_tile = len - len % kTile;
  const int64_t capacity = static_cast<int64_t>(ie - ib) * a.block_size;
  const bool row_ok = ib >= 0 && ie >= ib && len >= 0 && len <= capacity;
  const FoldSpan f = kFinish ? FinishFold(len, own_tile, a.partials.max_chunks, row_ok)
                             : MergeFold(item, own_tile, a.partials.max_chunks, row_ok);

  __shared__ TileShared<HD> sh;
  __shared__ int s_bad;
  GroupQuery qreg;
  LoadGroupQuery<HD>(GroupRow<HD>(a.q, row, a.n_heads, kvh, group), group, tid, qreg);
  TileAcc<HD> acc;
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) acc[i] = 0.0f;
  if (tid < group) {
    sh.m[tid] = -INFINITY;
    sh.l[tid] = 0.0f;
  }
  if (!f.fresh) LoadPartial<HD>(a.partials, row, a.n_heads, kvh, group, f.range, acc, sh, tid);
  if (tid < group) sh.corr[tid] = 1.0f;
  if (tid == 0) s_bad = f.ok ? 0 : 1;
  __syncthreads();

  // Entry len (the extra pair) is only reached by a finish tile.
  const int32_t* blocks = a.table_blocks + (f.ok ? ib : 0);
  if (f.ok) FoldTiles<HD>(a, blocks, row, kvh, len, f.begin, f.end, qreg, sh, s_bad, acc, tid);

  const bool bad = s_bad != 0;
  if (!kFinish || (f.ok && f.range > 0)) {
    StorePartial<HD>(a.partials, row, a.n_heads, kvh, group, f.range, acc, sh.m, sh.l, bad, tid);
  }
  if constexpr (kFinish) {
    TO* out_row = GroupRow<HD>(static_cast<TO*>(a.out), row, a.n_heads, kvh, group);
    if (!f.ok || f.range == 0) {  // one range: out = acc / l, as paged attention's one chunk
      StoreNormalized<HD>(out_row, acc, sh.l, outs, bad, /*nan_l_is_bad=*/true, tid);
      return;
    }
    __syncthreads();  // the own range's partial is stored: combine the row's ranges in order
    for (int o = tid; o < outs; o += kThreads) {
      const int head = kvh * group + o / HD;
      StoreF32(out_row, o,
               CombineChunks<HD>(a.partials, row, a.n_heads, head, f.range + 1, o % HD));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
