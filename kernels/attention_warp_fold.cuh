// Per-warp keys: the fold of paged attention's warp-fold split kernel (AttnWarpChunkKernel,
// paged_attention_kernels.cuh, PagedAttentionParams::fold = AttentionFold::kWarp). The CTA
// fold (attention_tile.cuh FoldTiles) walks a chunk's tiles one after another with the whole
// CTA on each tile, so a 256-key chunk is 8 dependent steps of loads, barriers and arithmetic.
// Here each of the CTA's kWarps warps walks its own tiles with its own running state:
// warp w folds the chunk's tiles w, w + kWarps, w + 2 kWarps, ... (32 keys each, in increasing
// order) into its (m, l, acc), with warp barriers only, so the warps' loads are in flight
// together and a 256-key chunk is 2 steps per warp. At the chunk's end the warps' states are
// merged in warp order (WarpMerge) into the chunk's (m, l, acc): the same split-KV partial the
// CTA fold produces, stored and combined by the same attention_combine.cuh code.
//
// A tile's arithmetic is the CTA fold's, done by one warp: kLanes lanes per key (TileShape), an
// 8-element dot per lane and a lane butterfly, a one-key-per-lane online softmax per head in
// base 2, acc = acc * corr + sum_j p_j v_j in key order. The value tile is copied to the warp's
// shared buffer with cp.async (no registers held) while the keys are scored.
//
// Bits: every sum has a fixed order that depends only on the row's keys and the chunk's place
// (the tile-to-warp assignment is by tile index within the chunk), so a row's output is batch
// invariant. It differs from the CTA fold's bits (the tiles are partitioned into four running
// states before the merge), so recurrent layers, whose merges continue a range's partial tile
// by tile across launches, keep the CTA fold (recurrent_attention.cuh).
//
// Not a public header; everything is in an anonymous namespace (one copy per including file).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_tile.cuh"

namespace morserve::kernels {
namespace {

// The warp fold kernel's __launch_bounds__ minimum of resident CTAs per SM (8 warps): its
// per-warp state needs more registers than the CTA fold's, and it is meant for small batches,
// whose grids leave SMs idle anyway.
constexpr int kWarpFoldMinCtasPerSm = 2;

// How one warp splits a tile for head_dim HD: kLanes lanes per key as in the CTA fold, so
// 32 / kLanes keys per pass and kLanes passes per tile; a lane accumulates kOut outputs.
template <int HD>
struct WarpTileShape {
  using S = TileShape<HD>;
  static constexpr int kKeysPerPass = 32 / S::kLanes;
  static constexpr int kPasses = kTile / kKeysPerPass;
  static constexpr int kOut = kMaxGroup * HD / 32;
  static constexpr int kBatch = kPasses < 8 ? kPasses : 8;  // K parts in flight per lane
  static_assert(kPasses % kBatch == 0, "whole batches of passes");
  static_assert(HD % 32 == 0, "a lane's outputs o = lane + 32 i keep one head per i");
  // The head of a lane's output i (o = lane + 32 i): the same for every lane, known at compile
  // time once the loop over i is unrolled.
  static constexpr int HeadOf(int i) { return 32 * i / HD; }
};

// One warp's shared memory: its value tile (then, after the walk, its accumulator for the
// merge), its probabilities and its keys' addresses.
template <int HD>
struct WarpTileShared {
  union {
    __align__(16) uint16_t v[kTile][HD];
    float acc[kMaxGroup * HD];  // fits: kMaxGroup * 4 <= kTile * 2
  };
  float p[kMaxGroup][kTile];
  const uint16_t* kp[kTile];
  const uint16_t* vp[kTile];
};
static_assert(kMaxGroup * 4 <= kTile * 2, "the merge's accumulator fits in the value tile");

// The CTA's shared memory: the warps' buffers, their final (m, l), and the merged (m, l).
template <int HD>
struct WarpFoldShared {
  WarpTileShared<HD> warp[kWarps];
  float m[kWarps][kMaxGroup];
  float l[kWarps][kMaxGroup];
  float m_all[kMaxGroup];
  float l_all[kMaxGroup];
};

// One warp's running state, in registers (the same value in every lane for m, l and corr).
template <int HD>
struct WarpFoldState {
  float m[kMaxGroup];
  float l[kMaxGroup];
  float corr[kMaxGroup];
  float acc[WarpTileShape<HD>::kOut];
};

template <int HD>
__device__ __forceinline__ void ResetWarpState(WarpFoldState<HD>& st) {
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.0f;
    st.corr[g] = 1.0f;
  }
#pragma unroll
  for (int i = 0; i < WarpTileShape<HD>::kOut; ++i) st.acc[i] = 0.0f;
}

// Starts the copies of a tile's value rows (keys j < valid) into the warp's buffer.
template <int HD>
__device__ __forceinline__ void CopyTileValuesAsync(int valid, WarpTileShared<HD>& ws, int lane) {
  constexpr int kParts = TileShape<HD>::kParts;
  for (int c = lane; c < valid * kParts; c += 32) {
    const int j = c / kParts;
    const int part = c % kParts;
    CopyAsync16(&ws.v[j][8 * part], ws.vp[j] + 8 * part);
  }
}

// Scores of a tile by one warp, kBatch passes at a time: their K parts are loaded first (in
// flight together), then each pass's kLanes lanes per key dot their 8 elements and reduce by a
// lane butterfly.
template <int HD>
__device__ __forceinline__ void WarpScoreTile(const QueryBits& q, int group, int valid,
                                              float score_scale, WarpTileShared<HD>& ws, int lane) {
  using S = TileShape<HD>;
  using W = WarpTileShape<HD>;
  const int lane_in_key = lane % S::kLanes;
  const int key_slot = lane / S::kLanes;
#pragma unroll
  for (int first = 0; first < W::kPasses; first += W::kBatch) {
    uint4 k[W::kBatch];
#pragma unroll
    for (int b = 0; b < W::kBatch; ++b) {
      const int j = (first + b) * W::kKeysPerPass + key_slot;
      k[b] = j < valid && S::HoldsPart(lane_in_key)
                 ? reinterpret_cast<const uint4*>(ws.kp[j])[lane_in_key]
                 : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int b = 0; b < W::kBatch; ++b) {
      const int j = (first + b) * W::kKeysPerPass + key_slot;
      float kf[8];
      Widen8(k[b], kf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {  // uniform over the warp: every lane reaches the shuffles
          float qf[8];
          Widen8(q[g], qf);
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qf[e], kf[e], dot);
#pragma unroll
          for (int off = S::kLanes / 2; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
          }
          if (lane_in_key == 0 && j < valid) ws.p[g][j] = dot * score_scale;
        }
      }
    }
  }
}

// Online softmax of a tile, one key per lane, head by head: scores become probabilities and the
// warp's (m, l) and corrections are updated (every lane keeps the same values).
template <int HD>
__device__ __forceinline__ void WarpSoftmaxTile(int group, int valid, WarpTileShared<HD>& ws,
                                                WarpFoldState<HD>& st, int lane) {
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      const float s = lane < valid ? ws.p[g][lane] : -INFINITY;
      float tmax = s;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(st.m[g], tmax);
      const float pr = lane < valid ? exp2f(s - m_new) : 0.0f;
      float psum = pr;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      st.corr[g] = exp2f(st.m[g] - m_new);  // 0 on the warp's first tile (m = -inf)
      st.m[g] = m_new;
      st.l[g] = fmaf(st.l[g], st.corr[g], psum);
      ws.p[g][lane] = pr;
    }
  }
}

// acc = acc * corr + sum_j p_j v_j, keys in order; a lane's output i is o = lane + 32 i.
template <int HD>
__device__ __forceinline__ void WarpAccumulateTile(int group, int valid,
                                                   const WarpTileShared<HD>& ws,
                                                   WarpFoldState<HD>& st, int lane) {
  using W = WarpTileShape<HD>;
#pragma unroll
  for (int i = 0; i < W::kOut; ++i) {
    const int g = W::HeadOf(i);
    if (g < group) {
      const int d = lane + 32 * i - g * HD;
      float x = st.acc[i] * st.corr[g];
      for (int j = 0; j < valid; ++j) x = fmaf(ws.p[g][j], Bf16BitsToF32(ws.v[j][d]), x);
      st.acc[i] = x;
    }
  }
}

// Warp `warp` folds its tiles of the chunk [begin, end) (tile index within the chunk = warp
// mod kWarps) into st, in increasing order (bad: the CTA's shared fault flag).
template <int HD>
__device__ __forceinline__ void WarpFoldTiles(const TileArgs& a, const int32_t* blocks, int row,
                                              int kvh, int len, int begin, int end,
                                              const QueryBits& q, WarpTileShared<HD>& ws, int& bad,
                                              WarpFoldState<HD>& st, int warp, int lane) {
  for (int tile = begin + warp * kTile; tile < end; tile += kWarps * kTile) {
    const int valid = min(kTile, end - tile);
    LocateTile<HD>(a, blocks, row, kvh, len, tile, valid, ws.kp, ws.vp, bad, lane);
    __syncwarp();
    CopyTileValuesAsync<HD>(valid, ws, lane);
    WarpScoreTile<HD>(q, a.group, valid, a.score_scale, ws, lane);
    __syncwarp();
    WarpSoftmaxTile<HD>(a.group, valid, ws, st, lane);
    WaitAsyncCopies();
    __syncwarp();
    WarpAccumulateTile<HD>(a.group, valid, ws, st, lane);
    __syncwarp();
  }
}

// Merges the warps' states in warp order into the chunk's state: m_all = max_w m_w, and
// l_all, acc_all = sum over w of l_w, acc_w * exp2(m_w - m_all) (a warp without tiles has
// m_w = -inf and adds exact zeros; a chunk without keys gets m_all = -inf, l_all = 0, acc 0).
// Returns acc_all in the CTA fold's layout (o = tid + kThreads i) and leaves (m_all, l_all)
// in sh; every thread of the CTA calls it.
template <int HD>
__device__ __forceinline__ void WarpMerge(int group, const WarpFoldState<HD>& st,
                                          WarpFoldShared<HD>& sh, TileAcc<HD>& acc, int warp,
                                          int lane, int tid) {
  using W = WarpTileShape<HD>;
  if (lane < group) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g == lane) {
        sh.m[warp][g] = st.m[g];
        sh.l[warp][g] = st.l[g];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < W::kOut; ++i) {
    if (W::HeadOf(i) < group) sh.warp[warp].acc[lane + 32 * i] = st.acc[i];
  }
  __syncthreads();
  if (tid < group) {
    float m_all = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, sh.m[w][tid]);
    float l_all = 0.0f;
    if (m_all != -INFINITY) {
      for (int w = 0; w < kWarps; ++w)
        l_all = fmaf(sh.l[w][tid], exp2f(sh.m[w][tid] - m_all), l_all);
    }
    sh.m_all[tid] = m_all;
    sh.l_all[tid] = l_all;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    float x = 0.0f;
    if (o < group * HD) {
      const int g = o / HD;
      const float m_all = sh.m_all[g];
      if (m_all != -INFINITY) {
        for (int w = 0; w < kWarps; ++w) x = fmaf(sh.warp[w].acc[o], exp2f(sh.m[w][g] - m_all), x);
      }
    }
    acc[i] = x;
  }
}

}  // namespace
}  // namespace morserve::kernels
