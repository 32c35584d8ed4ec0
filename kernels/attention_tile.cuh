// The per-tile arithmetic of attention over a paged KV cache, the one definition that both
// AttnChunkKernel (paged_attention_kernels.cuh) and RecurrentFoldKernel
// (recurrent_attention_kernels.cuh) call: the GQA group's query load, where a tile's keys live,
// the K and V loads, the q.k scores, the online-softmax update of (m, l) and the
// acc = acc * corr + sum_j p_j v_j fold, and the final acc / l. Because both kernels run these
// same functions, a recurrent row's output is bitwise paged attention's run as one split chunk
// by construction (the emulator tests check it). Not a public header; everything is in an
// anonymous namespace (one copy per including file).
//
// FoldTiles pipelines a span's tiles (double buffering): while tile t is scored, softmaxed and
// folded, the next tile's key addresses are located (into the other half of the shared
// pointer buffers) and its K and V parts are loaded into registers, so a tile's two dependent
// global round trips (block table, then K/V) overlap the previous tile's arithmetic instead of
// preceding its own. Only the load schedule changed: every sum has the order it had.
//
// Device helpers come from kernels/common.cuh under nvcc, or from kernels/emu/cuda_emu.h when
// MORSERVE_CUDA_EMU is defined.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/bf16_vector.cuh"
#include "kernels/device_helpers.cuh"
#include "kernels/paged_attention.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// The fold kernels' __launch_bounds__ minimum of resident CTAs per SM (12 warps).
constexpr int kMinCtasPerSm = 3;
constexpr int kTile = kAttentionTile;
constexpr int kMaxGroup = kAttentionMaxGroup;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kTile == 32, "the softmax step maps one key of a tile to one lane");

// The smallest power of two >= n (n >= 1).
constexpr int PowerOfTwoAtLeast(int n) { return n <= 1 ? 1 : 2 * PowerOfTwoAtLeast((n + 1) / 2); }

// How a CTA of kThreads threads splits a tile for head_dim HD (64, 96 or 128). A key's row is
// kParts 16-byte parts of 8 elements; kLanes lanes (the power of two >= kParts, so the lane
// butterfly stays inside a warp) share one key, and lane i < kParts holds part i. For HD 64
// and 128 every lane holds a part (kLanes == kParts); for HD 96 (12 parts on 16 lanes) lanes
// 12..15 of a key hold no part: their q and k slices are zeros, so they add +0 to the dot.
template <int HD>
struct TileShape {
  static constexpr int kParts = HD / 8;                     // 16-byte parts of a key row
  static constexpr int kLanes = PowerOfTwoAtLeast(kParts);  // lanes sharing one key
  static constexpr int kKeysPerPass = kThreads / kLanes;    // keys scored at once by the CTA
  static constexpr int kPasses = kTile / kKeysPerPass;
  static constexpr int kOutPerThread = kMaxGroup * HD / kThreads;
  static_assert(HD % 8 == 0 && kLanes <= 32 && kTile % kKeysPerPass == 0 &&
                    (kMaxGroup * HD) % kThreads == 0,
                "shape");
  // Whether lane_in_key holds a part (a constant true when kLanes == kParts).
  static __device__ __forceinline__ bool HoldsPart(int lane_in_key) {
    return kLanes == kParts || lane_in_key < kParts;
  }
};

// The CTA's shared memory for the fold (a kernel declares one as __shared__, with an int
// "bad" flag beside it: inside the struct, tail padding would grow the kernels' smem). The
// value tiles and key addresses are double-buffered (FoldTiles: tile t uses half t % 2).
template <int HD>
struct TileShared {
  __align__(16) uint16_t v[2][kTile][HD];
  float p[kMaxGroup][kTile];  // scores, then probabilities
  const uint16_t* kp[2][kTile];
  const uint16_t* vp[2][kTile];
  float m[kMaxGroup];  // running max (base 2)
  float l[kMaxGroup];  // running sum
  float corr[kMaxGroup];
};

// What the tile fold reads from a kernel's argument block (Args and RecurrentArgs extend it).
struct TileArgs {
  const uint16_t* q;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* table_indptr;
  const int32_t* table_blocks;
  const int32_t* kv_len;
  const uint16_t* extra_k;
  const uint16_t* extra_v;
  int n_heads;
  int n_kv_heads;
  int group;
  int block_size;
  int num_blocks;
  float score_scale;  // scale * log2(e)
};

// The TileArgs of a validated launch; P: PagedAttentionParams or RecurrentAttentionParams.
template <typename P>
inline void FillTileArgs(const P& p, TileArgs& a) {
  a.q = p.q;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.table_indptr = p.table_indptr;
  a.table_blocks = p.table_blocks;
  a.kv_len = p.kv_len;
  a.extra_k = p.extra_k;
  a.extra_v = p.extra_v;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.group = p.n_heads / p.n_kv_heads;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.score_scale = p.scale * kLog2e;
}

template <int HD>
using TileAcc = float[TileShape<HD>::kOutPerThread];
using GroupQuery = float[kMaxGroup][8];

__device__ __forceinline__ float QuietNan() { return __int_as_float(0x7fc00000); }

// The first element of the GQA group of kv head kvh in `row` of a [rows][n_heads][HD] tensor.
template <int HD, typename T>
__device__ __forceinline__ T* GroupRow(T* base, int row, int n_heads, int kvh, int group) {
  const int64_t q_stride = static_cast<int64_t>(n_heads) * HD;
  return base + row * q_stride + static_cast<int64_t>(kvh) * group * HD;
}

// This thread's slice of the group's query vectors as bf16 bits: key lane `tid % kLanes`
// covers elements [8 * lane, 8 * lane + 8) of every head (zeros on a lane that holds no part,
// and for the heads past the group).
using QueryBits = uint4[kMaxGroup];

template <int HD>
__device__ __forceinline__ void LoadQueryBits(const uint16_t* q_row, int group, int tid,
                                              QueryBits& q) {
  using S = TileShape<HD>;
  const int lane_in_key = tid % S::kLanes;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    q[g] = g < group && S::HoldsPart(lane_in_key)
               ? reinterpret_cast<const uint4*>(q_row + g * HD)[lane_in_key]
               : uint4{0u, 0u, 0u, 0u};
  }
}

// The same slice widened (exactly) to fp32, for the group's heads.
template <int HD>
__device__ __forceinline__ void LoadGroupQuery(const uint16_t* q_row, int group, int tid,
                                               GroupQuery& qreg) {
  QueryBits bits;
  LoadQueryBits<HD>(q_row, group, tid, bits);
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) Widen8(bits[g], qreg[g]);
  }
}

// 1. Where each key idx = tile + t (t < valid) lives: cache entry idx of the row when idx < len,
// else the row's extra pair. Keys past `valid` get a safe address that is not read. A block id
// out of range sets bad.
template <int HD>
__device__ __forceinline__ void LocateTile(const TileArgs& a, const int32_t* blocks, int row,
                                           int kvh, int len, int tile, int valid,
                                           const uint16_t** kps, const uint16_t** vps, int& bad,
                                           int tid) {
  if (tid >= kTile) return;
  const uint16_t* kp = a.k_cache;
  const uint16_t* vp = a.v_cache;
  if (tid < valid) {
    const int idx = tile + tid;
    if (idx < len) {
      const int32_t blk = blocks[idx / a.block_size];
      if (blk < 0 || blk >= a.num_blocks) {
        bad = 1;
      } else {
        const int64_t slot = static_cast<int64_t>(blk) * a.block_size + idx % a.block_size;
        const int64_t off = (slot * a.n_kv_heads + kvh) * HD;
        kp = a.k_cache + off;
        vp = a.v_cache + off;
      }
    } else {  // idx == len: the extra pair
      const int64_t off = (static_cast<int64_t>(row) * a.n_kv_heads + kvh) * HD;
      kp = a.extra_k + off;
      vp = a.extra_v + off;
    }
  }
  kps[tid] = kp;
  vps[tid] = vp;
}

// 2a. One thread's K and V parts of a tile, in registers from their load (a tile ahead, in
// FoldTiles) to their use: the K part of each ScoreTile pass (zeros where the pass's key is
// past `valid` or the lane holds no part) and the V parts this thread copies to shared memory.
template <int HD>
struct TileRegs {
  static constexpr int kValueLoads =
      (kTile * TileShape<HD>::kParts + kThreads - 1) / kThreads;  // 16-byte V parts per thread
  uint4 k[TileShape<HD>::kPasses];
  uint4 v[kValueLoads];
};

// Issues the loads of a tile's K and V parts (addresses from LocateTile) into registers.
template <int HD>
__device__ __forceinline__ void LoadTileRegs(int valid, const uint16_t* const* kps,
                                             const uint16_t* const* vps, TileRegs<HD>& r, int tid) {
  using S = TileShape<HD>;
  const int lane_in_key = tid % S::kLanes;
  const int key_slot = tid / S::kLanes;
#pragma unroll
  for (int pass = 0; pass < S::kPasses; ++pass) {
    const int j = pass * S::kKeysPerPass + key_slot;
    r.k[pass] = j < valid && S::HoldsPart(lane_in_key)
                    ? reinterpret_cast<const uint4*>(kps[j])[lane_in_key]
                    : uint4{0u, 0u, 0u, 0u};
  }
#pragma unroll
  for (int i = 0; i < TileRegs<HD>::kValueLoads; ++i) {
    const int c = tid + i * kThreads;
    const int j = c / S::kParts;
    if (c < kTile * S::kParts && j < valid) {
      r.v[i] = reinterpret_cast<const uint4*>(vps[j])[c % S::kParts];
    }
  }
}

// Copies the V parts LoadTileRegs loaded into the tile's shared value buffer.
template <int HD>
__device__ __forceinline__ void StoreTileValues(int valid, const TileRegs<HD>& r, uint16_t (*v)[HD],
                                                int tid) {
  constexpr int kParts = TileShape<HD>::kParts;
#pragma unroll
  for (int i = 0; i < TileRegs<HD>::kValueLoads; ++i) {
    const int c = tid + i * kThreads;
    const int j = c / kParts;
    if (c < kTile * kParts && j < valid) reinterpret_cast<uint4*>(&v[j][0])[c % kParts] = r.v[i];
  }
}

// 2b. Scores from the K parts in registers: kLanes lanes per key, each an 8-element dot (0 on
// a lane without a part: its K part is zeros), then a lane butterfly.
template <int HD>
__device__ __forceinline__ void ScoreTile(const GroupQuery& qreg, int group, int valid,
                                          float score_scale, const TileRegs<HD>& r,
                                          TileShared<HD>& sh, int tid) {
  using S = TileShape<HD>;
  const int lane_in_key = tid % S::kLanes;
  const int key_slot = tid / S::kLanes;
#pragma unroll
  for (int pass = 0; pass < S::kPasses; ++pass) {
    const int j = pass * S::kKeysPerPass + key_slot;
    float kf[8];
    Widen8(r.k[pass], kf);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {  // uniform over the CTA: every lane reaches the shuffles
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qreg[g][e], kf[e], dot);
#pragma unroll
        for (int off = S::kLanes / 2; off > 0; off >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, off);
        }
        if (lane_in_key == 0 && j < valid) sh.p[g][j] = dot * score_scale;
      }
    }
  }
}

// 3. Online softmax, one warp per head, one key per lane: scores become probabilities and
// (m, l) and the acc correction are updated.
template <int HD>
__device__ __forceinline__ void SoftmaxTile(int group, int valid, TileShared<HD>& sh, int tid) {
  const int warp = tid / 32;
  const int lane = tid % 32;
  for (int g = warp; g < group; g += kWarps) {
    const float m_old = sh.m[g];
    const float s = lane < valid ? sh.p[g][lane] : -INFINITY;
    float tmax = s;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float m_new = fmaxf(m_old, tmax);
    const float pr = lane < valid ? exp2f(s - m_new) : 0.0f;
    float psum = pr;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
    const float corr = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
    sh.p[g][lane] = pr;
    __syncwarp();
    if (lane == 0) {
      sh.m[g] = m_new;
      sh.l[g] = fmaf(sh.l[g], corr, psum);
      sh.corr[g] = corr;
    }
  }
}

// 4. acc = acc * corr + sum_j p_j v_j, keys in order; output o = g * HD + d.
template <int HD>
__device__ __forceinline__ void AccumulateTile(int outs, int valid, const uint16_t (*v)[HD],
                                               const TileShared<HD>& sh, TileAcc<HD>& acc,
                                               int tid) {
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    if (o < outs) {
      const int g = o / HD;
      const int d = o % HD;
      float x = acc[i] * sh.corr[g];
      for (int j = 0; j < valid; ++j) x = fmaf(sh.p[g][j], Bf16BitsToF32(v[j][d]), x);
      acc[i] = x;
    }
  }
}

// Folds the row's keys [begin, end) into (sh.m, sh.l, acc), tile by tile in key order: steps
// 1 to 4 with the CTA barriers between them, pipelined one tile ahead (bad: the CTA's shared
// flag). Every thread of the CTA calls it with the same span.
template <int HD>
__device__ __forceinline__ void FoldTiles(const TileArgs& a, const int32_t* blocks, int row,
                                          int kvh, int len, int begin, int end,
                                          const GroupQuery& qreg, TileShared<HD>& sh, int& bad,
                                          TileAcc<HD>& acc, int tid) {
  if (begin >= end) return;
  TileRegs<HD> regs;
  LocateTile<HD>(a, blocks, row, kvh, len, begin, min(kTile, end - begin), sh.kp[0], sh.vp[0], bad,
                 tid);
  __syncthreads();
  LoadTileRegs<HD>(min(kTile, end - begin), sh.kp[0], sh.vp[0], regs, tid);
  int buf = 0;
  for (int tile = begin; tile < end; tile += kTile, buf ^= 1) {
    const int valid = min(kTile, end - tile);
    const int next = tile + kTile;  // the next tile, located and loaded during this one
    const int next_valid = min(kTile, end - next);
    StoreTileValues<HD>(valid, regs, sh.v[buf], tid);
    if (next < end) {
      LocateTile<HD>(a, blocks, row, kvh, len, next, next_valid, sh.kp[buf ^ 1], sh.vp[buf ^ 1],
                     bad, tid);
    }
    ScoreTile<HD>(qreg, a.group, valid, a.score_scale, regs, sh, tid);
    __syncthreads();
    if (next < end) LoadTileRegs<HD>(next_valid, sh.kp[buf ^ 1], sh.vp[buf ^ 1], regs, tid);
    SoftmaxTile<HD>(a.group, valid, sh, tid);
    __syncthreads();
    AccumulateTile<HD>(a.group * HD, valid, sh.v[buf], sh, acc, tid);
    __syncthreads();
  }
}

// out = acc / l[g] per head g (0 where l is not positive); NaN where `bad`, or where l is NaN
// and nan_l_is_bad.
template <int HD, typename TO>
__device__ __forceinline__ void StoreNormalized(TO* out_row, const TileAcc<HD>& acc,
                                                const float* l_of, int outs, bool bad,
                                                bool nan_l_is_bad, int tid) {
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    if (o < outs) {
      const float l = l_of[o / HD];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      StoreF32(out_row, o, (bad || (nan_l_is_bad && isnan(l))) ? QuietNan() : acc[i] * inv);
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
