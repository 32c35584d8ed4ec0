// Segmented LoRA expand-and-add, the second half of per-loop LoRA over a mixed-depth batch
// (docs/models.md#per-loop-weights; SGMV-style, one launch for every loop's rows):
//   y[r, o] += sum_j t[r, j] * B[loop(r)][o, j]     (o < out, j < rank)
// with the adapters of every loop stacked, B [num_loops, out, rank] bf16 (the LoRA scale
// alpha / rank already folded in), t [rows, rank] fp32 or bf16 (lora_shrink's output) and y
// [rows, out] fp32, the base GEMM's output, updated in place. Segments as in lora_shrink.cuh
// (seg_indptr / seg_loop in device memory: no host sync, graph-capturable). Rows outside
// every segment are left alone; a segment whose loop is outside [0, num_loops) gets NaN rows.
//
// Work split: a CTA of 128 threads takes 16 rows of one segment and 128 output columns, one
// column per thread; it stages its B columns (fp32, padded rows: no bank conflicts) and the
// rows' t in shared memory, 64 rank columns per pass for any rank.
// Precision and order: per output, acc = fmaf(t[r, j], B[o, j], acc) for j = 0, 1, ... rank-1
// from acc = 0, then y = y + acc (one fp32 add). The order depends only on the rank, so a
// row's result is the same alone or in any batch (batch invariance), bit for bit.
//
// Requirements (cudaErrorInvalidValue otherwise, before any launch): rows >= 0,
// num_segments >= 0 (0 rows or 0 segments launch nothing), out > 0,
// 1 <= rank <= kLoraMaxRank (lora_shrink.cuh), num_loops >= 1, t_dtype kF32 or kBF16,
// non-null pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"
#include "kernels/lora_shrink.cuh"

namespace morserve::kernels {

struct LoraExpandParams {
  const void* t = nullptr;              // [rows, rank], t_dtype
  const uint16_t* b = nullptr;          // [num_loops, out, rank] bf16
  float* y = nullptr;                   // [rows, out] fp32, accumulated into
  const int32_t* seg_indptr = nullptr;  // [num_segments + 1], device
  const int32_t* seg_loop = nullptr;    // [num_segments], device
  int num_segments = 0;
  int rows = 0;
  int out = 0;
  int rank = 0;
  int num_loops = 0;
  DType t_dtype = DType::kF32;
};

// Launches on `stream`; never allocates or synchronises.
cudaError_t lora_expand_forward(const LoraExpandParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
