// Recurrent attention kernel body (merge and finish) and its argument block, shared by the
// CUDA launcher (recurrent_attention.cu) and the CPU emulation test
// (tests/gpu/kernel_recurrent_attention_emu_test.cc). Not a public header: the contract is in
// recurrent_attention.cuh. It reuses the constants and helpers of paged_attention_kernels.cuh
// (kThreads, kTile, Widen8, ...) because the tile fold below must stay op for op the split
// kernel's there: the tests compare the two bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/paged_attention_kernels.cuh"
#include "kernels/recurrent_attention.cuh"

namespace morserve::kernels {
namespace {

static_assert(kRecurrentTile == kTile, "recurrent folds use the paged attention tile");

struct RecurrentArgs {
  const uint16_t* q;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* table_indptr;
  const int32_t* table_blocks;
  const int32_t* kv_len;
  const uint16_t* extra_k;
  const uint16_t* extra_v;
  float* state_ml;
  float* state_acc;
  const RecurrentFoldItem* items;
  void* out;
  int rows;
  int n_heads;
  int n_kv_heads;
  int group;
  int block_size;
  int num_blocks;
  float score_scale;  // scale * log2(e)
};

inline RecurrentArgs MakeRecurrentArgs(const RecurrentAttentionParams& p) {
  RecurrentArgs a;
  a.q = p.q;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.table_indptr = p.table_indptr;
  a.table_blocks = p.table_blocks;
  a.kv_len = p.kv_len;
  a.extra_k = p.extra_k;
  a.extra_v = p.extra_v;
  a.state_ml = p.state_ml;
  a.state_acc = p.state_acc;
  a.items = p.items;
  a.out = p.out;
  a.rows = p.rows;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.group = p.n_heads / p.n_kv_heads;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.score_scale = p.scale * kLog2e;
  return a;
}

// One CTA per (item, kv head). kFinish: the finish launch (partial tile + extra pair, then
// out = acc / l); otherwise a merge (state in, state out). TO: output type (finish only).
template <int HD, bool kFinish, typename TO>
__global__ void __launch_bounds__(kThreads) RecurrentFoldKernel(const RecurrentArgs a) {
  constexpr int kLanes = HD / 8;
  constexpr int kKeysPerPass = kThreads / kLanes;
  constexpr int kPasses = kTile / kKeysPerPass;
  constexpr int kOutPerThread = kMaxGroup * HD / kThreads;
  static_assert(kTile % kKeysPerPass == 0 && (kMaxGroup * HD) % kThreads == 0, "shape");

  const RecurrentFoldItem item = a.items[blockIdx.x];
  const int row = item.row;
  if (row < 0 || row >= a.rows) return;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int group = a.group;
  const int outs = group * HD;
  const int64_t q_stride = static_cast<int64_t>(a.n_heads) * HD;
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

  __shared__ __align__(16) uint16_t s_v[kTile][HD];
  __shared__ float s_p[kMaxGroup][kTile];
  __shared__ const uint16_t* s_kp[kTile];
  __shared__ const uint16_t* s_vp[kTile];
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup], s_corr[kMaxGroup];
  __shared__ int s_bad;

  const bool fresh = (item.flags & kRecurrentFresh) != 0;
  const int lane_in_key = tid % kLanes;
  const int key_slot = tid / kLanes;
  float qreg[kMaxGroup][8];
  const uint16_t* q_row = a.q + row * q_stride + static_cast<int64_t>(kvh) * group * HD;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      const uint4 v = reinterpret_cast<const uint4*>(q_row + g * HD)[lane_in_key];
      Widen8(v, qreg[g]);
    }
  }
  if (tid < group) {
    s_m[tid] = fresh ? -INFINITY : ml[2 * tid];
    s_l[tid] = fresh ? 0.0f : ml[2 * tid + 1];
    s_corr[tid] = 1.0f;
  }
  if (tid == 0) s_bad = ok ? 0 : 1;
  float acc[kOutPerThread];
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    acc[i] = (o < outs && !fresh) ? st_acc[o] : 0.0f;
  }
  __syncthreads();

  const int32_t* blocks = a.table_blocks + (ok ? ib : 0);
  const int warp = tid / 32;
  const int lane = tid % 32;
  for (int tile = begin; ok && tile < end; tile += kTile) {
    const int valid = min(kTile, end - tile);

    // 1. Where each key of the tile lives (a cache slot, or the extra pair at entry len).
    if (tid < kTile) {
      const uint16_t* kp = a.k_cache;
      const uint16_t* vp = a.v_cache;
      if (tid < valid) {
        const int idx = tile + tid;
        if (idx < len) {
          const int32_t blk = blocks[idx / a.block_size];
          if (blk < 0 || blk >= a.num_blocks) {
            s_bad = 1;
          } else {
            const int64_t slot = static_cast<int64_t>(blk) * a.block_size + idx % a.block_size;
            const int64_t off = (slot * a.n_kv_heads + kvh) * HD;
            kp = a.k_cache + off;
            vp = a.v_cache + off;
          }
        } else {  // idx == len: only a finish tile reaches it
          const int64_t off = (static_cast<int64_t>(row) * a.n_kv_heads + kvh) * HD;
          kp = a.extra_k + off;
          vp = a.extra_v + off;
        }
      }
      s_kp[tid] = kp;
      s_vp[tid] = vp;
    }
    __syncthreads();

    // 2a. Values to shared memory; 2b. scores (exactly AttnChunkKernel's steps 2a/2b).
    for (int c = tid; c < kTile * kLanes; c += kThreads) {
      const int j = c / kLanes;
      const int part = c % kLanes;
      if (j < valid) {
        reinterpret_cast<uint4*>(&s_v[j][0])[part] = reinterpret_cast<const uint4*>(s_vp[j])[part];
      }
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int j = pass * kKeysPerPass + key_slot;
      float kf[8];
      if (j < valid) {
        Widen8(reinterpret_cast<const uint4*>(s_kp[j])[lane_in_key], kf);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[e] = 0.0f;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qreg[g][e], kf[e], dot);
#pragma unroll
          for (int off = kLanes / 2; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
          }
          if (lane_in_key == 0 && j < valid) s_p[g][j] = dot * a.score_scale;
        }
      }
    }
    __syncthreads();

    // 3. Online softmax, one warp per head, one key per lane (AttnChunkKernel's step 3).
    for (int g = warp; g < group; g += kWarps) {
      const float m_old = s_m[g];
      const float s = lane < valid ? s_p[g][lane] : -INFINITY;
      float tmax = s;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(m_old, tmax);
      const float pr = lane < valid ? exp2f(s - m_new) : 0.0f;
      float psum = pr;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      const float corr = exp2f(m_old - m_new);
      s_p[g][lane] = pr;
      __syncwarp();
      if (lane == 0) {
        s_m[g] = m_new;
        s_l[g] = fmaf(s_l[g], corr, psum);
        s_corr[g] = corr;
      }
    }
    __syncthreads();

    // 4. acc = acc * corr + sum_j p_j v_j, keys in order (AttnChunkKernel's step 4).
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int o = tid + i * kThreads;
      if (o < outs) {
        const int g = o / HD;
        const int d = o % HD;
        float x = acc[i] * s_corr[g];
        for (int j = 0; j < valid; ++j) x = fmaf(s_p[g][j], Bf16BitsToF32(s_v[j][d]), x);
        acc[i] = x;
      }
    }
    __syncthreads();
  }

  const bool bad = s_bad != 0;
  if constexpr (kFinish) {
    TO* out_row = static_cast<TO*>(a.out) + row * q_stride + static_cast<int64_t>(kvh) * group * HD;
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int o = tid + i * kThreads;
      if (o < outs) {
        const float l = s_l[o / HD];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        StoreF32(out_row, o, (bad || isnan(l)) ? QuietNan() : acc[i] * inv);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int o = tid + i * kThreads;
      if (o < outs) st_acc[o] = bad ? QuietNan() : acc[i];
    }
    if (tid < group) {
      ml[2 * tid] = s_m[tid];
      ml[2 * tid + 1] = bad ? QuietNan() : s_l[tid];
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
