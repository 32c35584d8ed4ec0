// Segmented LoRA expand-and-add kernel, shared by the CUDA launcher (lora_expand.cu) and the
// CPU emulation test (tests/gpu/kernel_lora_emu_test.cc). Not a public header: the contract
// is in lora_expand.cuh. Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_segments.cuh"

namespace morserve::kernels {
namespace {

constexpr int kExpandThreads = 128;  // one output column each
constexpr int kExpandTileRows = 16;  // rows per CTA

// The launch grid: x over row tiles (see lora_segments.cuh), y over groups of 128 columns.
inline dim3 LoraExpandGrid(int rows, int num_segments, int out) {
  return dim3(static_cast<unsigned>(LoraTileCount(rows, num_segments, kExpandTileRows)),
              static_cast<unsigned>((out + kExpandThreads - 1) / kExpandThreads), 1);
}

// Rank columns per shared-memory pass: the smallest of 16, 32, 64 that holds the rank
// (larger ranks take several passes of 64). Only the register tile's size depends on it,
// never the order of the sums.
inline int LoraExpandChunk(int rank) { return rank <= 16 ? 16 : rank <= 32 ? 32 : 64; }

// CTA (blockIdx.x: row tile, blockIdx.y: 128 output columns). kChunk: rank columns per pass.
template <typename TT, int kChunk>
__global__ void __launch_bounds__(kExpandThreads)
    LoraExpandKernel(const TT* __restrict__ t, const uint16_t* __restrict__ b,
                     float* __restrict__ y, const int32_t* __restrict__ seg_indptr,
                     const int32_t* __restrict__ seg_loop, int num_segments, int rows, int out,
                     int rank, int num_loops) {
  __shared__ float s_b[kExpandThreads * (kChunk + 1)];  // [column][rank column], padded rows
  __shared__ __align__(16) float s_t[kExpandTileRows * kChunk];  // [row][rank column]
  const LoraTile tile = FindLoraTile(seg_indptr, seg_loop, num_segments, rows, kExpandTileRows,
                                     static_cast<int64_t>(blockIdx.x));
  if (tile.end <= tile.begin) return;  // the same for the whole CTA, before any barrier
  const int tid = static_cast<int>(threadIdx.x);
  const int o0 = static_cast<int>(blockIdx.y) * kExpandThreads;
  const int cols = min(kExpandThreads, out - o0);
  const int nrows = tile.end - tile.begin;
  float* y_col = y + static_cast<int64_t>(tile.begin) * out + o0 + tid;  // row tile.begin
  if (tile.loop < 0 || tile.loop >= num_loops) {
    if (tid < cols) {
      for (int r = 0; r < nrows; ++r) y_col[static_cast<int64_t>(r) * out] = LoraFaultValue();
    }
    return;
  }
  const uint16_t* b_cols = b + (static_cast<int64_t>(tile.loop) * out + o0) * rank;
  const TT* t_rows = t + static_cast<int64_t>(tile.begin) * rank;
  float acc[kExpandTileRows];
#pragma unroll
  for (int r = 0; r < kExpandTileRows; ++r) acc[r] = 0.0f;
  for (int c0 = 0; c0 < rank; c0 += kChunk) {
    const int width = min(kChunk, rank - c0);
    const int stride = width | 1;  // odd: the threads' rows start in distinct banks
    // B[o0 + oc, c0 + jc] for the CTA's columns: consecutive threads, consecutive addresses.
    for (int e = tid; e < cols * width; e += kExpandThreads) {
      const int oc = e / width, jc = e - oc * width;
      s_b[oc * stride + jc] = Bf16BitsToF32(b_cols[static_cast<int64_t>(oc) * rank + c0 + jc]);
    }
    for (int e = tid; e < nrows * width; e += kExpandThreads) {
      const int r = e / width, jc = e - r * width;
      s_t[r * kChunk + jc] = LoadF32(t_rows, static_cast<int64_t>(r) * rank + c0 + jc);
    }
    __syncthreads();
    if (tid < cols) {
      float bj[kChunk];
#pragma unroll
      for (int jc = 0; jc < kChunk; ++jc) bj[jc] = jc < width ? s_b[tid * stride + jc] : 0.0f;
#pragma unroll
      for (int r = 0; r < kExpandTileRows; ++r) {
        if (r < nrows) {
          // t read 4 columns per shared-memory load (a broadcast: every thread reads the
          // same row), the sum still one column after the other.
          const float4* t4 = reinterpret_cast<const float4*>(s_t + r * kChunk);
          float s = acc[r];
#pragma unroll
          for (int j4 = 0; j4 < kChunk / 4; ++j4) {
            const float4 tv = t4[j4];
            const float tj[4] = {tv.x, tv.y, tv.z, tv.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              if (4 * j4 + q < width) s = fmaf(tj[q], bj[4 * j4 + q], s);
            }
          }
          acc[r] = s;
        }
      }
    }
    __syncthreads();  // before the next pass overwrites s_b / s_t
  }
  if (tid < cols) {
#pragma unroll
    for (int r = 0; r < kExpandTileRows; ++r) {
      if (r < nrows) {
        float* yr = y_col + static_cast<int64_t>(r) * out;
        *yr = __fadd_rn(*yr, acc[r]);
      }
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
