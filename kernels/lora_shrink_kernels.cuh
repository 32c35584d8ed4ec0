// Segmented LoRA shrink kernel, shared by the CUDA launcher (lora_shrink.cu) and the CPU
// emulation test (tests/gpu/kernel_lora_emu_test.cc). Not a public header: the contract is
// in lora_shrink.cuh. Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cstdint>

#include "kernels/lora_segments.cuh"
#include "kernels/lora_shrink.cuh"
#ifndef MORSERVE_CUDA_EMU
#include "kernels/common.cuh"
#endif

namespace morserve::kernels {
namespace {

constexpr int kShrinkThreads = 128;                      // 4 warps
constexpr int kShrinkRowsPerWarp = 4;                    // register tile: 4 rows ...
constexpr int kShrinkRanksPerCta = 8;                    // ... x 8 rank outputs = 32 lanes
constexpr int kShrinkTileRows = 4 * kShrinkRowsPerWarp;  // rows per CTA

// The launch grid: x over row tiles (see lora_segments.cuh), y over groups of 8 ranks.
inline dim3 LoraShrinkGrid(int rows, int num_segments, int rank) {
  return dim3(static_cast<unsigned>(LoraTileCount(rows, num_segments, kShrinkTileRows)),
              static_cast<unsigned>((rank + kShrinkRanksPerCta - 1) / kShrinkRanksPerCta), 1);
}

// Widens 8 bf16 values held in a 16-byte vector (element 2i in the low half of word i).
__device__ __forceinline__ void LoraWiden8(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
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

// CTA (blockIdx.x: row tile, blockIdx.y: group of 8 ranks). No block barrier: a warp with
// no rows returns early.
template <typename TT>
__global__ void __launch_bounds__(kShrinkThreads)
    LoraShrinkKernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ a,
                     TT* __restrict__ t, const int32_t* __restrict__ seg_indptr,
                     const int32_t* __restrict__ seg_loop, int num_segments, int rows, int in,
                     int rank, int num_loops) {
  const LoraTile tile = FindLoraTile(seg_indptr, seg_loop, num_segments, rows, kShrinkTileRows,
                                     static_cast<int64_t>(blockIdx.x));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int row0 = tile.begin + warp * kShrinkRowsPerWarp;
  if (row0 >= tile.end) return;  // the same for the whole warp
  const int nrows = min(kShrinkRowsPerWarp, tile.end - row0);
  const int j0 = static_cast<int>(blockIdx.y) * kShrinkRanksPerCta;
  // The output this lane writes after the reduction: row slot lane / 8, rank slot lane % 8.
  const int my_row = lane / kShrinkRanksPerCta, my_j = j0 + lane % kShrinkRanksPerCta;
  const bool writes = my_row < nrows && my_j < rank;
  const int64_t out_at = static_cast<int64_t>(row0 + my_row) * rank + my_j;
  if (tile.loop < 0 || tile.loop >= num_loops) {
    if (writes) StoreF32(t, out_at, LoraFaultValue());
    return;
  }
  // Slots past the last row or rank read the last valid one; their sums are dropped.
  const uint4* xv[kShrinkRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kShrinkRowsPerWarp; ++r) {
    xv[r] = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row0 + min(r, nrows - 1)) * in);
  }
  const uint16_t* a_loop = a + static_cast<int64_t>(tile.loop) * rank * in;
  const uint4* av[kShrinkRanksPerCta];
#pragma unroll
  for (int j = 0; j < kShrinkRanksPerCta; ++j) {
    av[j] =
        reinterpret_cast<const uint4*>(a_loop + static_cast<int64_t>(min(j0 + j, rank - 1)) * in);
  }
  float acc[kShrinkRowsPerWarp * kShrinkRanksPerCta];  // [row slot][rank slot]
#pragma unroll
  for (int e = 0; e < kShrinkRowsPerWarp * kShrinkRanksPerCta; ++e) acc[e] = 0.0f;
  const int vecs = in / 8;
  for (int v = lane; v < vecs; v += 32) {
    float xf[kShrinkRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kShrinkRowsPerWarp; ++r) LoraWiden8(xv[r][v], xf[r]);
#pragma unroll
    for (int j = 0; j < kShrinkRanksPerCta; ++j) {
      float af[8];
      LoraWiden8(av[j][v], af);
#pragma unroll
      for (int r = 0; r < kShrinkRowsPerWarp; ++r) {
        float s = acc[r * kShrinkRanksPerCta + j];
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(xf[r][e], af[e], s);
        acc[r * kShrinkRanksPerCta + j] = s;
      }
    }
  }
  const float sum = WarpTransposeSum(acc, lane);
  if (writes) StoreF32(t, out_at, sum);
}

}  // namespace
}  // namespace morserve::kernels
