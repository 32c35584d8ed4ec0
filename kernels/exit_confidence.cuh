// Early-exit decision of Recursive / Relaxed models (docs/models.md#early-exit,
// ModelExecutor::ExitByConfidence): after a loop, a row exits when the max softmax
// probability of its exit logits lm_head(RMSNorm_final(h)) reaches its threshold.
//
//   max_prob[r] = 1 / sum_i exp(logits[r, i] - max_i logits[r, i])      (double)
//   exit[r]     = max_prob[r] >= threshold[r]                           (int32 1 / 0)
//
// Thresholds are per row (a request may override the model's). One CTA per row; the sum is
// double in a fixed order (each thread a strided subset in index order, a shuffle tree,
// warps in order), so a row's result is deterministic and batch invariant, and it equals
// the executor's sequential double sum to about 1e-15 relative.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct ExitConfidenceParams {
  const void* logits = nullptr;      // [rows, row_stride], dtype; the first vocab are read
  DType dtype = DType::kF32;         // kF32 or kBF16
  int64_t row_stride = 0;            // 0 means vocab
  const float* threshold = nullptr;  // [rows]
  int32_t* exit = nullptr;           // [rows]
  double* max_prob = nullptr;        // optional [rows]
  int rows = 0;                      // 0 is allowed (nothing is launched)
  int vocab = 0;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a bad dtype, a null pointer, a
// non-positive vocab or a row_stride below vocab; otherwise the launch's error.
cudaError_t exit_confidence_forward(const ExitConfidenceParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
