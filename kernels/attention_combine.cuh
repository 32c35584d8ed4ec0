// Split-KV partials of the attention kernels, the one definition that AttnChunkKernel /
// AttnCombineKernel (paged_attention_kernels.cuh) and RecurrentFoldKernel
// (recurrent_attention_kernels.cuh) call: where the partial (m, l, acc) of a (row, head, chunk)
// lives in a workspace, a CTA's store and load of its group's partials, and the combine of a
// row's chunks in chunk order. A recurrent row's ranges are paged attention's chunks of
// kRecurrentRange keys, so running the same store and combine code makes the two bitwise equal
// by construction (the emulator tests check it). Not a public header; everything is in an
// anonymous namespace (one copy per including file).
//
// Workspace layout (both kernels): acc [rows][n_heads][max_chunks][HD] first, then
// ml [rows][n_heads][max_chunks][2] (running max in base 2, running sum; a NaN sum marks a
// partial whose fold saw a fault).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/attention_tile.cuh"

namespace morserve::kernels {
namespace {

// Where a split kernel's partials live (Args and RecurrentArgs carry one).
struct PartialArgs {
  float* acc;  // [rows][n_heads][max_chunks][HD]
  float* ml;   // [rows][n_heads][max_chunks][2]
  int max_chunks;
};

// The partials of a launch over `rows` rows in `workspace` (max_chunks per (row, head)).
inline PartialArgs MakePartialArgs(float* workspace, int rows, int n_heads, int head_dim,
                                   int max_chunks) {
  const size_t partials = static_cast<size_t>(rows) * n_heads * max_chunks;
  return {workspace, workspace == nullptr ? nullptr : workspace + partials * head_dim, max_chunks};
}

// Index of the partial of (row, head, chunk), in units of one partial.
__device__ __forceinline__ int64_t PartialIndex(const PartialArgs& w, int row, int n_heads,
                                                int head, int chunk) {
  return (static_cast<int64_t>(row) * n_heads + head) * w.max_chunks + chunk;
}

// Stores a CTA's fold state (acc; running max m[g] and sum l[g] per head of the group) as the
// partials of chunk `chunk` of the GQA group of kv head kvh; bad stores a NaN sum, which
// poisons every output the partial reaches.
template <int HD>
__device__ __forceinline__ void StorePartial(const PartialArgs& w, int row, int n_heads, int kvh,
                                             int group, int chunk, const TileAcc<HD>& acc,
                                             const float* m, const float* l, bool bad, int tid) {
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    if (o < group * HD) {
      const int g = o / HD;
      const int d = o % HD;
      const int64_t idx = PartialIndex(w, row, n_heads, kvh * group + g, chunk);
      w.acc[idx * HD + d] = acc[i];
      if (d == 0) {
        w.ml[2 * idx] = m[g];
        w.ml[2 * idx + 1] = bad ? QuietNan() : l[g];
      }
    }
  }
}

// The inverse of StorePartial: (sh.m, sh.l, acc) from chunk `chunk`'s partials. Threads
// tid < group write sh.m / sh.l: the caller's barrier publishes them.
template <int HD>
__device__ __forceinline__ void LoadPartial(const PartialArgs& w, int row, int n_heads, int kvh,
                                            int group, int chunk, TileAcc<HD>& acc,
                                            TileShared<HD>& sh, int tid) {
  if (tid < group) {
    const int64_t idx = PartialIndex(w, row, n_heads, kvh * group + tid, chunk);
    sh.m[tid] = w.ml[2 * idx];
    sh.l[tid] = w.ml[2 * idx + 1];
  }
#pragma unroll
  for (int i = 0; i < TileShape<HD>::kOutPerThread; ++i) {
    const int o = tid + i * kThreads;
    if (o < group * HD) {
      const int64_t idx = PartialIndex(w, row, n_heads, kvh * group + o / HD, chunk);
      acc[i] = w.acc[idx * HD + o % HD];
    }
  }
}

// Output element d of (row, head) from its chunks [0, nchunks), merged in chunk order: the
// largest running max first, then l and acc summed chunk by chunk with weights
// exp2(m_c - max), then acc / l. NaN when any chunk's sum is NaN (a fault).
template <int HD>
__device__ __forceinline__ float CombineChunks(const PartialArgs& w, int row, int n_heads, int head,
                                               int nchunks, int d) {
  const int64_t base = PartialIndex(w, row, n_heads, head, 0);
  float m_all = -INFINITY;
  bool bad = false;
  for (int c = 0; c < nchunks; ++c) {
    m_all = fmaxf(m_all, w.ml[2 * (base + c)]);
    bad = bad || isnan(w.ml[2 * (base + c) + 1]);
  }
  float l_all = 0.0f;
  float o = 0.0f;
  for (int c = 0; c < nchunks; ++c) {
    const float wc = exp2f(w.ml[2 * (base + c)] - m_all);
    l_all = fmaf(w.ml[2 * (base + c) + 1], wc, l_all);
    o = fmaf(w.acc[(base + c) * HD + d], wc, o);
  }
  return bad ? QuietNan() : o * (1.0f / l_all);
}

}  // namespace
}  // namespace morserve::kernels
