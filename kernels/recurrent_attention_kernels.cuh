// Recurrent attention kernel body (merge and finish) and its argument block, shared by the
// CUDA launcher (recurrent_attention.cu) and the CPU emulation test
// (tests/gpu/kernel_recurrent_attention_emu_test.cc). Not a public header: the contract is in
// recurrent_attention.cuh. Its tile fold is kernels/attention_tile.cuh's FoldTile, the one
// paged attention's split kernel runs, so a row equals paged attention as one split chunk bit
// for bit (the tests compare the two).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_tile.cuh"
#include "kernels/paged_attention_kernels.cuh"  // Args: the emulator test compares with it
#include "kernels/recurrent_attention.cuh"

namespace morserve::kernels {
namespace {

static_assert(kRecurrentTile == kTile, "recurrent folds use the paged attention tile");

// Everything the kernels read, passed by value: the tile fold's fields, then the state's.
struct RecurrentArgs : TileArgs {
  float* state_ml;
  float* state_acc;
  const RecurrentFoldItem* items;
  void* out;
  int rows;
};

inline RecurrentArgs MakeRecurrentArgs(const RecurrentAttentionParams& p) {
  RecurrentArgs a;
  FillTileArgs(p, a);
  a.state_ml = p.state_ml;
  a.state_acc = p.state_acc;
  a.items = p.items;
  a.out = p.out;
  a.rows = p.rows;
  return a;
}

// One CTA per (item, kv head). kFinish: the finish launch (partial tile + extra pair, then
// out = acc / l); otherwise a merge (state in, state out). TO: output type (finish only).
template <int HD, bool kFinish, typename TO>
__global__ void __launch_bounds__(kThreads) RecurrentFoldKernel(const RecurrentArgs a) {
  constexpr int kOutPerThread = TileShape<HD>::kOutPerThread;
  const RecurrentFoldItem item = a.items[blockIdx.x];
  const int row = item.row;
  if (row < 0 || row >= a.rows) return;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int group = a.group;
  const int outs = group * HD;
  const int64_t head0 = static_cast<int64_t>(row) * a.n_heads + static_cast<int64_t>(kvh) * group;
  float* ml = a.state_ml + 2 * head0;        // [group][2]
  float* st_acc = a.state_acc + head0 * HD;  // [group][HD]

  // The row's entries and this launch's key range: [begin, end), end == len + 1 for finish
  // (entry len is the extra pair).
  const int32_t ib = a.table_indptr[row];
  const int32_t ie = a.table_indptr[row + 1];
  const int len = a.kv_len[row];
  const int own_tile = len - len % kTile;
  const int begin = kFinish ? own_tile : item.key_begin;
  const int end = kFinish ? len + 1 : item.key_end;
  const int64_t capacity = static_cast<int64_t>(ie - ib) * a.block_size;
  const bool range_ok =
      kFinish || (begin % kTile == 0 && end % kTile == 0 && begin <= end && end <= own_tile);
  const bool ok = ib >= 0 && ie >= ib && len >= 0 && len <= capacity && begin >= 0 && range_ok;

  __shared__ TileShared<HD> sh;
  __shared__ int s_bad;
  const bool fresh = (item.flags & kRecurrentFresh) != 0;
  GroupQuery qreg;
  LoadGroupQuery<HD>(GroupRow<HD>(a.q, row, a.n_heads, kvh, group), group, tid, qreg);
  if (tid < group) {
    sh.m[tid] = fresh ? -INFINITY : ml[2 * tid];
    sh.l[tid] = fresh ? 0.0f : ml[2 * tid + 1];
    sh.corr[tid] = 1.0f;
  }
  if (tid == 0) s_bad = ok ? 0 : 1;
  TileAcc<HD> acc;
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    acc[i] = (o < outs && !fresh) ? st_acc[o] : 0.0f;
  }
  __syncthreads();

  // Entry len (the extra pair) is only reached by a finish tile.
  const int32_t* blocks = a.table_blocks + (ok ? ib : 0);
  for (int tile = begin; ok && tile < end; tile += kTile) {
    const int valid = min(kTile, end - tile);
    FoldTile<HD>(a, blocks, row, kvh, len, tile, valid, qreg, sh, s_bad, acc, tid);
  }

  const bool bad = s_bad != 0;
  if constexpr (kFinish) {
    TO* out_row = GroupRow<HD>(static_cast<TO*>(a.out), row, a.n_heads, kvh, group);
    StoreNormalized<HD>(out_row, acc, sh, outs, bad, /*nan_l_is_bad=*/true, tid);
  } else {
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int o = tid + i * kThreads;
      if (o < outs) st_acc[o] = bad ? QuietNan() : acc[i];
    }
    if (tid < group) {
      ml[2 * tid] = sh.m[tid];
      ml[2 * tid + 1] = bad ? QuietNan() : sh.l[tid];
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
