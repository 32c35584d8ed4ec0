// Paged attention kernels (split and combine) and their argument block, shared by the CUDA
// launcher (paged_attention.cu) and the CPU emulation test (tests/gpu/
// kernel_paged_attention_emu_test.cc, which runs these same kernel bodies with one fiber per
// CUDA thread). Not a public header: the contract is in paged_attention.cuh. Everything here
// is in an anonymous namespace of morserve::kernels (one copy per including file).
//
// Device helpers come from kernels/common.cuh under nvcc, or from tests/gpu/cuda_emu.h when
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
constexpr int kTile = kAttentionTile;
constexpr int kMaxGroup = kAttentionMaxGroup;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kTile == 32, "the softmax step maps one key of a tile to one lane");

// Everything the kernels read, passed by value.
struct Args {
  const uint16_t* q;
  const uint16_t* k_cache;
  const uint16_t* v_cache;
  const int32_t* table_indptr;
  const int32_t* table_blocks;
  const int32_t* kv_len;
  const uint16_t* extra_k;
  const uint16_t* extra_v;
  void* out;
  float* partial_acc;  // [rows][n_heads][max_chunks][head_dim]
  float* partial_ml;   // [rows][n_heads][max_chunks][2]: running max (base 2) and sum
  int n_heads;
  int n_kv_heads;
  int group;
  int block_size;
  int num_blocks;
  int max_chunks;
  int chunk_len;
  float score_scale;  // scale * log2(e)
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
  info.ok = info.ok && info.nchunks <= a.max_chunks;
  return info;
}

__device__ __forceinline__ float QuietNan() { return __int_as_float(0x7fc00000); }

// One CTA per (row, kv head, chunk). HD: head_dim; TO: float or uint16_t (bf16 bits).
template <int HD, typename TO>
__global__ void __launch_bounds__(kThreads) AttnChunkKernel(const Args a) {
  constexpr int kLanes = HD / 8;                   // lanes sharing one key (8 elements each)
  constexpr int kKeysPerPass = kThreads / kLanes;  // keys scored at once by the CTA
  constexpr int kPasses = kTile / kKeysPerPass;
  constexpr int kOutPerThread = kMaxGroup * HD / kThreads;
  static_assert(kTile % kKeysPerPass == 0 && (kMaxGroup * HD) % kThreads == 0, "shape");

  const int row = blockIdx.x;
  const int kvh = blockIdx.y;
  const int chunk = blockIdx.z;
  const int tid = threadIdx.x;
  const int group = a.group;
  const int outs = group * HD;  // this CTA's outputs: heads kvh*group .. +group, all dims
  const int64_t q_stride = static_cast<int64_t>(a.n_heads) * HD;
  TO* out_row = static_cast<TO*>(a.out) + row * q_stride + static_cast<int64_t>(kvh) * group * HD;

  const RowInfo info = GetRow(a, row);
  if (!info.ok) {
    if (chunk == 0) {
      for (int o = tid; o < outs; o += kThreads) StoreF32(out_row, o, QuietNan());
    }
    return;
  }
  if (chunk >= info.nchunks) return;
  const int begin = chunk * a.chunk_len;
  const int end = min(info.total, begin + a.chunk_len);

  __shared__ __align__(16) uint16_t s_v[kTile][HD];
  __shared__ float s_p[kMaxGroup][kTile];  // scores, then probabilities
  __shared__ const uint16_t* s_kp[kTile];
  __shared__ const uint16_t* s_vp[kTile];
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup], s_corr[kMaxGroup];
  __shared__ int s_bad;

  // This thread's slice of the group's query vectors: key lane `lane_in_key` covers
  // elements [8 * lane_in_key, 8 * lane_in_key + 8) of every head.
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
  if (tid < kMaxGroup) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
    s_corr[tid] = 1.0f;
  }
  if (tid == 0) s_bad = 0;
  float acc[kOutPerThread];
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) acc[i] = 0.0f;
  __syncthreads();

  const int32_t* blocks = a.table_blocks + a.table_indptr[row];
  const int warp = tid / 32;
  const int lane = tid % 32;
  for (int tile = begin; tile < end; tile += kTile) {
    const int valid = min(kTile, end - tile);

    // 1. Where each key of the tile lives (a cache slot or the row's extra pair).
    if (tid < kTile) {
      const uint16_t* kp = a.k_cache;  // a safe address for keys that are not read
      const uint16_t* vp = a.v_cache;
      if (tid < valid) {
        const int idx = tile + tid;
        if (idx < info.len) {
          const int32_t blk = blocks[idx / a.block_size];
          if (blk < 0 || blk >= a.num_blocks) {
            s_bad = 1;
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
      s_kp[tid] = kp;
      s_vp[tid] = vp;
    }
    __syncthreads();

    // 2a. The tile's values to shared memory, 16 bytes per load.
    for (int c = tid; c < kTile * kLanes; c += kThreads) {
      const int j = c / kLanes;
      const int part = c % kLanes;
      if (j < valid) {
        reinterpret_cast<uint4*>(&s_v[j][0])[part] = reinterpret_cast<const uint4*>(s_vp[j])[part];
      }
    }
    // 2b. Scores: kLanes lanes per key, each an 8-element dot, then a lane butterfly.
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
        if (g < group) {  // uniform over the CTA: every lane reaches the shuffles
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

    // 3. Online softmax, one warp per head, one key per lane.
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
      const float corr = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
      s_p[g][lane] = pr;
      __syncwarp();
      if (lane == 0) {
        s_m[g] = m_new;
        s_l[g] = fmaf(s_l[g], corr, psum);
        s_corr[g] = corr;
      }
    }
    __syncthreads();

    // 4. acc = acc * corr + sum_j p_j v_j, keys in order; output o = g * HD + d.
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
  if (info.nchunks == 1) {
#pragma unroll
    for (int i = 0; i < kOutPerThread; ++i) {
      const int o = tid + i * kThreads;
      if (o < outs) {
        const float l = s_l[o / HD];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        StoreF32(out_row, o, bad ? QuietNan() : acc[i] * inv);
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    if (o < outs) {
      const int g = o / HD;
      const int d = o % HD;
      const int64_t idx =
          (static_cast<int64_t>(row) * a.n_heads + kvh * group + g) * a.max_chunks + chunk;
      a.partial_acc[idx * HD + d] = acc[i];
      if (d == 0) {
        a.partial_ml[2 * idx] = s_m[g];
        a.partial_ml[2 * idx + 1] = bad ? QuietNan() : s_l[g];
      }
    }
  }
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
  const int64_t base = (static_cast<int64_t>(row) * a.n_heads + head) * a.max_chunks;
  float m_all = -INFINITY;
  bool bad = false;
  for (int c = 0; c < info.nchunks; ++c) {
    m_all = fmaxf(m_all, a.partial_ml[2 * (base + c)]);
    bad = bad || isnan(a.partial_ml[2 * (base + c) + 1]);
  }
  float l_all = 0.0f;
  float o = 0.0f;
  for (int c = 0; c < info.nchunks; ++c) {
    const float w = exp2f(a.partial_ml[2 * (base + c)] - m_all);
    l_all = fmaf(a.partial_ml[2 * (base + c) + 1], w, l_all);
    o = fmaf(a.partial_acc[(base + c) * HD + d], w, o);
  }
  TO* out = static_cast<TO*>(a.out) + static_cast<int64_t>(row) * a.n_heads * HD +
            static_cast<int64_t>(head) * HD;
  StoreF32(out, d, bad ? QuietNan() : o * (1.0f / l_all));
}

// The kernels' argument block for a validated launch (see paged_attention_forward).
inline Args MakeArgs(const PagedAttentionParams& p, int max_chunks) {
  Args a;
  a.q = p.q;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.table_indptr = p.table_indptr;
  a.table_blocks = p.table_blocks;
  a.kv_len = p.kv_len;
  a.extra_k = p.extra_k;
  a.extra_v = p.extra_v;
  a.out = p.out;
  const size_t partials = static_cast<size_t>(p.rows) * p.n_heads * max_chunks;
  a.partial_acc = p.workspace;
  a.partial_ml = p.workspace == nullptr ? nullptr : p.workspace + partials * p.head_dim;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.group = p.n_heads / p.n_kv_heads;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.max_chunks = max_chunks;
  a.chunk_len = p.chunk_len;
  a.score_scale = p.scale * kLog2e;
  return a;
}

}  // namespace
}  // namespace morserve::kernels
