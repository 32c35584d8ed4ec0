// Huginn-0125's adaptive exit statistic on the device (docs/models.md#huginn-0125): for each row
// i of this recurrence's logits x (fp32), its log-partition and the KL divergence from the
// previous recurrence's distribution, which the caller keeps in a pool of rows:
//
//   log_z    = m + log(sum_j exp(x_j - m)),  m = max_j x_j                    (fp64)
//   kl[i]    = sum_j P_prev,j (log P_prev,j - log P_j)    with has_prev[i] != 0
//            = sum_j (1/V) (-log V - log P_j)             without (P_prev uniform)
//   log P_j  = x_j - log_z, log P_prev,j = prev[prev_rows[i]]_j - prev_log_z[prev_rows[i]]
//
// then x becomes the kept row: prev[prev_rows[i]] = x, prev_log_z[prev_rows[i]] = log_z (the
// next recurrence's "previous"; a row that exits simply never reads it again).
// Each term is HuginnNormalize / HuginnKl's (engine/model/huginn_state.h) in fp64; only the
// summation order differs from the host's index order. Fixed order, one CTA of 256 threads per
// row: thread t sums j = t, t + 256, ... ascending, the 32 lanes of a warp are combined by an
// xor-shuffle tree (offsets 16, 8, 4, 2, 1), then the 8 warps' partials in warp order; the
// max is exact in any order. So the result depends on nothing but the row (batch-invariant),
// and differs from the host's by rounding only (tests/gpu/kernel_huginn_kl_test.cc: 1e-12
// relative).
// A kept-row index outside [0, capacity) (a fault only the device could see) gives kl NaN and
// writes nothing.
//
// Graph-capturable: no allocation, no synchronisation, indices read from device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace morserve::kernels {

struct HuginnKlParams {
  const float* logits = nullptr;       // [n, vocab] fp32: this recurrence's
  float* prev_logits = nullptr;        // [capacity, vocab] fp32: the kept rows (read, then set)
  double* prev_log_z = nullptr;        // [capacity]
  int64_t capacity = 0;                // rows the pool holds
  const int32_t* prev_rows = nullptr;  // [n] device: row i's kept row
  const int32_t* has_prev = nullptr;   // [n] device: 0: P_prev uniform (the first check)
  double* kl = nullptr;                // [n] out
  int n = 0;                           // 0 is allowed (nothing is launched)
  int vocab = 0;                       // > 0
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a negative n, vocab <= 0, and (when
// n > 0) a null pointer or a capacity < 1; otherwise the launch's error. Rows i and k with the
// same prev_rows entry race: the caller gives each row its own.
cudaError_t huginn_kl_forward(const HuginnKlParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
