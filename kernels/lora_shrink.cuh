// Segmented LoRA shrink, the first half of per-loop LoRA over a mixed-depth batch
// (docs/models.md#per-loop-weights; SGMV-style, one launch for every loop's rows):
//   t[r, j] = sum_c x[r, c] * A[loop(r)][j, c]     (j < rank, c < in)
// with the adapters of every loop stacked in one tensor, A [num_loops, rank, in] bf16,
// x [rows, in] bf16 and t [rows, rank] fp32 or bf16. The rows come in segments: segment s is
// rows [seg_indptr[s], seg_indptr[s + 1]) at loop seg_loop[s] (int32 arrays in device
// memory: no host sync, graph-capturable; see lora_segments.cuh). Rows outside every segment
// are not written; a segment whose loop is outside [0, num_loops) gets NaN rows.
//
// Work split: a CTA of 4 warps takes 4 rows of one segment and 8 of the rank outputs (a
// 4 x 8 register tile per thread); its 128 threads stride over `in` in 16-byte vectors, so
// even a single row keeps 4 warps per CTA busy.
// Precision and order: fp32 fmaf products-and-sums. Thread g = 32 * warp + lane sums the
// vectors v = g, g + 128, ... of the row in order (8 elements each, in order); each warp adds
// its 32 lane partials over a fixed pairing tree (lanes l and l ^ 16 first, then ^ 8, ^ 4,
// ^ 2, ^ 1); the 4 warp partials are added in warp order. That order depends only on `in`,
// never on the other rows or on a row's place in its tile, so a row's result is the same
// alone or in any batch (batch invariance), bit for bit.
//
// Requirements (cudaErrorInvalidValue otherwise, before any launch): rows >= 0,
// num_segments >= 0 (0 rows or 0 segments launch nothing), in > 0 and a multiple of 8,
// 1 <= rank <= kLoraMaxRank, num_loops >= 1, t_dtype kF32 or kBF16, non-null pointers,
// x and a 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

// A sanity bound on the rank (the kernels take any rank up to it; LoRA ranks are <= 64 in
// practice, a fused projection sums its parts' ranks).
constexpr int kLoraMaxRank = 4096;

struct LoraShrinkParams {
  const uint16_t* x = nullptr;          // [rows, in] bf16
  const uint16_t* a = nullptr;          // [num_loops, rank, in] bf16
  void* t = nullptr;                    // [rows, rank], t_dtype
  const int32_t* seg_indptr = nullptr;  // [num_segments + 1], device
  const int32_t* seg_loop = nullptr;    // [num_segments], device
  int num_segments = 0;
  int rows = 0;
  int in = 0;
  int rank = 0;
  int num_loops = 0;
  DType t_dtype = DType::kF32;
};

// Launches on `stream`; never allocates or synchronises.
cudaError_t lora_shrink_forward(const LoraShrinkParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
