// Token-choice (MoR) router decision on the segment input
// (docs/models.md#mixture-of-recursions-token-choice, ModelExecutor::EntryRouting): one
// depth and gate per row.
//
//   s_r      = router_w[j] · x0_r for j < num_recursions     (linear router, computed here)
//              or scores_in[r, :]                            (mlp routers: scores from GEMMs)
//   p        = alpha * softmax(s)   or   alpha * sigmoid(s)  (double, as the executor)
//   best     = argmax_j (p_j + bias_j), lowest j on ties
//   depth_r  = best + 1 (int32),  gate_r = float(p_best)
//
// Precision: the linear scores are fp32 dot products in a fixed order (one CTA per row, a
// strided per-thread subset in index order, shuffle tree, warps in order); everything after
// the scores is double, mirroring the executor, so given scores decide exactly as the CPU.
//
// Batch invariance: one CTA per row with a fixed block size and reduction order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

enum class TokenChoiceActivation { kSoftmax, kSigmoid };

// Most recursions a row may choose among.
inline constexpr int kTokenChoiceMaxRecursions = 16;

struct TokenChoiceRouterParams {
  // Linear router: h and router_w set, scores_in null. Precomputed: scores_in set, h null.
  const float* h = nullptr;          // [rows, hidden] fp32 (the segment input x0)
  const void* router_w = nullptr;    // [num_recursions, hidden], w_dtype
  DType w_dtype = DType::kF32;       // kF32 or kBF16
  const float* scores_in = nullptr;  // [rows, num_recursions]
  const float* bias = nullptr;       // optional [num_recursions]
  float* scores_out = nullptr;       // optional [rows, num_recursions]
  int32_t* depth = nullptr;          // [rows], 1 .. num_recursions
  float* gate = nullptr;             // [rows]
  int rows = 0;                      // 0 is allowed (nothing is launched)
  int hidden = 0;
  int num_recursions = 0;  // 1 .. kTokenChoiceMaxRecursions
  float alpha = 1.0f;
  TokenChoiceActivation activation = TokenChoiceActivation::kSoftmax;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for an inconsistent mode, a null
// required pointer, a bad dtype or sizes out of range; otherwise the launch's error.
cudaError_t token_choice_router_forward(const TokenChoiceRouterParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
