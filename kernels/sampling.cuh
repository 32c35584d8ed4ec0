// Sampling on the device with the CPU sampler's semantics (engine/runtime/sampler.h) from
// the stage after penalties on: a row chooses from its raw logits, or from its processed copy
// (allowed ids, bias, min_tokens ban and penalties applied by logit_process.cuh) when
// processed_row names one; its reported logit is always the raw one. One CTA per row,
// per-row parameters in device arrays (graph-friendly):
//
//   greedy (temperature < kSamplingGreedyTemperature): argmax, ties to the lowest id
//   otherwise: x = logits / temperature (fp32) -> top_k (exactly k, ties to the lowest ids)
//              -> p = float(exp(x - max)) over the kept ids -> top_p (the smallest prefix,
//              ranked by p descending then id ascending, whose mass reaches top_p * total)
//              -> min_p (p >= min_p * max p) -> inverse CDF over the kept ids in ascending
//              id order at u = UniformForStep(seed, step) (the sampler's counter-based RNG:
//              splitmix64 finaliser, 53-bit uniform).
//
// Exactness: the selections are exact radix selects on the values' bits; top_p's per-bin
// masses are fixed-point sums (p * 2^44 truncated to uint64, exact for p >= 2^-20) reduced
// with integer atomics, its target and the final inverse CDF use double sums in a fixed order
// (each thread's ids in order, then a fixed block scan), so a row's token is bit-for-bit
// deterministic and independent of its batch. The CPU sums in double sequentially; a token
// can differ from the CPU's only when the uniform or the top_p target lands within rounding
// of a cumulative-mass boundary (about 1e-15 relative; 2^-44 per element for elements below
// 2^-20 when the top_p cut falls among them).
// exp is evaluated in double and rounded to fp32 (the correctly rounded expf in practice).
//
// Faults: a row with no finite logit after filtering (all -inf) or NaN parameters gets
// token -1.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace morserve::kernels {

// The sampler's greedy threshold (engine/runtime/sampling_params.h kGreedyTemperature).
inline constexpr float kSamplingGreedyTemperature = 1e-5f;

struct DeviceSamplingParams {
  const float* logits = nullptr;  // [rows, row_stride] fp32, penalised, the first vocab read
  int64_t row_stride = 0;         // 0 means vocab
  int rows = 0;                   // 0 is allowed (nothing is launched)
  int vocab = 0;
  // Per-row parameters, device arrays of `rows` entries.
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;  // <= 0 or >= vocab: off
  const float* top_p = nullptr;    // 1: off
  const float* min_p = nullptr;    // 0: off
  const uint64_t* seed = nullptr;
  const uint64_t* step = nullptr;  // output tokens already generated (the RNG counter)
  int32_t* token = nullptr;        // [rows]
  // Optional [rows]: the chosen token's raw logit (before temperature; NaN for token -1), from
  // which the caller forms its logprob with the row's log-partition.
  float* chosen_logit = nullptr;
  // Optional: processed rows [*, vocab] (logit_process_forward's out) and, per row, the
  // processed row it chooses from (-1: its raw logits). Both or neither.
  const float* processed = nullptr;
  const int32_t* processed_row = nullptr;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a null pointer, a non-positive
// vocab or a row_stride below vocab; otherwise the launch's error.
cudaError_t sampling_forward(const DeviceSamplingParams& p, cudaStream_t stream);

// The uniform the sampler draws for (seed, step); the same function on the host, for tests.
double SamplingUniform(uint64_t seed, uint64_t step);

}  // namespace morserve::kernels
