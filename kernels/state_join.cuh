// Huginn-0125's adapter input (docs/models.md#huginn-0125): each row's recurrent state s and
// prelude output e, fp32 rows of a state pool, joined and rounded to bf16 (the GEMM's input
// dtype):
//
//   out[i] = [ bf16(states[s_rows[i]]) | bf16(states[e_rows[i]]) ]      [n, 2 * dim] bf16
//
// Rounding: to nearest even (__float2bfloat16_rn; F32ToBf16 on the host gives the same bits
// for every finite value), so the join equals the host's one. An index outside [0, capacity)
// (a fault only the device could see) writes that half as bf16 NaN instead of reading out of
// bounds.
//
// Grid: a grid-stride loop over the rows, one CTA per row at a time (at most 4096 CTAs).
// Graph-capturable: no allocation, no synchronisation, indices read from device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace morserve::kernels {

struct StateJoinParams {
  const float* states = nullptr;    // [capacity, dim] fp32
  int64_t capacity = 0;             // rows `states` holds
  const int32_t* s_rows = nullptr;  // [n] device: the first half's rows
  const int32_t* e_rows = nullptr;  // [n] device: the second half's rows
  uint16_t* out = nullptr;          // [n, 2 * dim] bf16
  int n = 0;                        // 0 is allowed (nothing is launched)
  int dim = 0;                      // > 0
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a negative n, dim <= 0, and (when
// n > 0) a null pointer or a capacity < 1; otherwise the launch's error.
cudaError_t state_join_forward(const StateJoinParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
