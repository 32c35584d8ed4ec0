// Greedy sampling on the device: token[r] = argmax_i logits[r, i], ties to the lowest index
// (engine/runtime/sampler's Argmax). One CTA per row.
//
// Exact: the reduction keeps (value, index) under a total order (larger value first, then
// smaller index), so the result is the CPU's for any reduction order and any batch.
// NaN logits never win (a row of NaN only yields index 0); -inf is an ordinary value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct ArgmaxParams {
  const void* logits = nullptr;  // [rows, row_stride] of which the first vocab are read
  DType dtype = DType::kF32;     // kF32 or kBF16
  int64_t row_stride = 0;        // elements between rows; 0 means vocab
  int32_t* token = nullptr;      // [rows]
  float* max_logit = nullptr;    // optional [rows]: the winning value
  int rows = 0;                  // 0 is allowed (nothing is launched)
  int vocab = 0;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a bad dtype, a null pointer, a
// non-positive vocab or a row_stride below vocab; otherwise the launch's error.
cudaError_t argmax_forward(const ArgmaxParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
