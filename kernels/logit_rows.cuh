// The launch-parameter check shared by the per-row reductions over logits (argmax_forward,
// exit_confidence_forward): rows of `vocab` fp32 or bf16 values, `row_stride` apart.
// Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

// cudaErrorInvalidValue for negative rows, a non-positive vocab, a row_stride below vocab or
// a dtype other than kF32/kBF16; otherwise cudaSuccess with *stride the elements between rows
// (row_stride, or vocab where it is 0).
inline cudaError_t CheckLogitRows(int rows, int vocab, int64_t row_stride, DType dtype,
                                  int64_t* stride) {
  *stride = row_stride == 0 ? vocab : row_stride;
  if (rows < 0 || vocab <= 0 || *stride < vocab ||
      (dtype != DType::kF32 && dtype != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace morserve::kernels
