// Segmented LoRA shrink kernel, shared by the CUDA launcher (lora_shrink.cu) and the CPU
// emulation test (tests/gpu/kernel_lora_emu_test.cc). Not a public header: the contract is
// in lora_shrink.cuh. Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cstdint>

#include "kernels/bf16_vector.cuh"
#include "kernels/device_helpers.cuh"
#include "kernels/lora_segments.cuh"
#include "kernels/lora_shrink.cuh"

namespace morserve::kernels {
namespace {

constexpr int kShrinkWarps = 4;
constexpr int kShrinkThreads = 32 * kShrinkWarps;
constexpr int kShrinkRowsPerCta = 4;   // register tile: 4 rows ...
constexpr int kShrinkRanksPerCta = 8;  // ... x 8 rank outputs = one per lane after the sum

// The launch grid: x over row tiles (see lora_segments.cuh), y over groups of 8 ranks.
inline dim3 LoraShrinkGrid(int rows, int num_segments, int rank) {
  return dim3(static_cast<unsigned>(LoraTileCount(rows, num_segments, kShrinkRowsPerCta)),
              static_cast<unsigned>((rank + kShrinkRanksPerCta - 1) / kShrinkRanksPerCta), 1);
}

// One step of the transpose reduction: v[0, 2 * kOff) hold this lane's partials of 2 * kOff
// elements; afterwards v[0, kOff) hold the sums with lane ^ kOff of the half selected by this
// lane's kOff bit (the upper half when it is set).
template <int kOff>
__device__ __forceinline__ void TransposeSumStep(float* v, int lane) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int i = 0; i < kOff; ++i) {
    const float send = upper ? v[i] : v[i + kOff];
    const float keep = upper ? v[i + kOff] : v[i];
    v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, kOff));
  }
}

// Sums v[e] over the warp's 32 lanes for every e < 32; lane l returns the sum of element l.
// Each element is added over the same tree (pairs l, l ^ 16 first, then ^ 8, ...), so the
// sum of an element does not depend on its index e.
__device__ __forceinline__ float WarpTransposeSum(float* v, int lane) {
  TransposeSumStep<16>(v, lane);
  TransposeSumStep<8>(v, lane);
  TransposeSumStep<4>(v, lane);
  TransposeSumStep<2>(v, lane);
  TransposeSumStep<1>(v, lane);
  return v[0];
}

// CTA (blockIdx.x: row tile, blockIdx.y: group of 8 ranks). Thread g = 32 * warp + lane
// takes the 16-byte vectors g, g + 128, ... of the rows and of the 8 rank rows of A; each
// warp then adds its lanes' partials (WarpTransposeSum) and warp 0 adds the 4 warp partials
// in warp order. Every exit before the barrier is taken by the whole CTA.
template <typename TT>
__global__ void __launch_bounds__(kShrinkThreads)
    LoraShrinkKernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ a,
                     TT* __restrict__ t, const int32_t* __restrict__ seg_indptr,
                     const int32_t* __restrict__ seg_loop, int num_segments, int rows, int in,
                     int rank, int num_loops) {
  __shared__ float s_partial[kShrinkWarps][kShrinkRowsPerCta * kShrinkRanksPerCta];
  const LoraTile tile = FindLoraTile(seg_indptr, seg_loop, num_segments, rows, kShrinkRowsPerCta,
                                     static_cast<int64_t>(blockIdx.x));
  if (tile.end <= tile.begin) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int nrows = tile.end - tile.begin;  // 1..4
  const int j0 = static_cast<int>(blockIdx.y) * kShrinkRanksPerCta;
  // The output lane l of warp 0 writes: row slot l / 8, rank slot l % 8.
  const int my_row = lane / kShrinkRanksPerCta, my_j = j0 + lane % kShrinkRanksPerCta;
  const bool writes = warp == 0 && my_row < nrows && my_j < rank;
  const int64_t out_at = static_cast<int64_t>(tile.begin + my_row) * rank + my_j;
  if (tile.loop < 0 || tile.loop >= num_loops) {
    if (writes) StoreF32(t, out_at, LoraFaultValue());
    return;
  }
  // Slots past the last row or rank read the last valid one; their sums are dropped.
  const uint4* xv[kShrinkRowsPerCta];
#pragma unroll
  for (int r = 0; r < kShrinkRowsPerCta; ++r) {
    xv[r] = reinterpret_cast<const uint4*>(
        x + static_cast<int64_t>(tile.begin + min(r, nrows - 1)) * in);
  }
  const uint16_t* a_loop = a + static_cast<int64_t>(tile.loop) * rank * in;
  const uint4* av[kShrinkRanksPerCta];
#pragma unroll
  for (int j = 0; j < kShrinkRanksPerCta; ++j) {
    av[j] =
        reinterpret_cast<const uint4*>(a_loop + static_cast<int64_t>(min(j0 + j, rank - 1)) * in);
  }
  float acc[kShrinkRowsPerCta * kShrinkRanksPerCta];  // [row slot][rank slot]
#pragma unroll
  for (int e = 0; e < kShrinkRowsPerCta * kShrinkRanksPerCta; ++e) acc[e] = 0.0f;
  const int vecs = in / 8;
  for (int v = tid; v < vecs; v += kShrinkThreads) {
    float xf[kShrinkRowsPerCta][8];
#pragma unroll
    for (int r = 0; r < kShrinkRowsPerCta; ++r) Widen8(xv[r][v], xf[r]);
#pragma unroll
    for (int j = 0; j < kShrinkRanksPerCta; ++j) {
      float af[8];
      Widen8(av[j][v], af);
#pragma unroll
      for (int r = 0; r < kShrinkRowsPerCta; ++r) {
        float s = acc[r * kShrinkRanksPerCta + j];
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(xf[r][e], af[e], s);
        acc[r * kShrinkRanksPerCta + j] = s;
      }
    }
  }
  s_partial[warp][lane] = WarpTransposeSum(acc, lane);
  __syncthreads();
  if (writes) {
    float sum = s_partial[0][lane];
#pragma unroll
    for (int w = 1; w < kShrinkWarps; ++w) sum = __fadd_rn(sum, s_partial[w][lane]);
    StoreF32(t, out_at, sum);
  }
}

}  // namespace
}  // namespace morserve::kernels
