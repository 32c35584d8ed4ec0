// Row-wise fp32 ops for the CPU backend. Each output row depends only on its own input row
// (and on the shared weights), every reduction runs inside one row in a fixed order, so the
// results are batch invariant and independent of threading by construction.
//
// Precision conventions (chosen to match engine/reference within fp32 rounding):
// - RmsNormRows: sum of squares accumulated in double in index order; out = float(w * (x * inv))
//   with inv = 1 / sqrt(ss / dim + eps) in double.
// - RopeRows: rotate_half (pairs i and i + head_dim/2; RopePairsRows: 2i and 2i + 1); inv_freq =
// theta^(-2i/head_dim),
//   angle = pos * inv_freq, cos and sin all in double; the rotation is done in double and
//   rounded to fp32 once.
// - GeluErf: evaluated in double, rounded once (SwiGLU's SiLU: silu_mul.h).
// All functions accept rows == 0. Pointers for in-place use are noted per function.
#pragma once

#include <cstdint>

#include "engine/model/tensor_view.h"

namespace morserve {

// out[r, :] = RMSNorm(x[r, :]) * w. out may equal x.
void RmsNormRows(const float* x, const float* w, int rows, int dim, float eps, float* out);

// out[i] = a[i] + b[i] for rows*dim elements. out may equal a or b.
void AddRows(const float* a, const float* b, int rows, int dim, float* out);

// h[r, :] += scale[r] * b[r, :] (in place; scale computed in fp32: h + float(scale * b)).
void ScaleAddRows(float* h, const float* b, const float* scale_per_row, int rows, int dim);

// In place: x[i] = gelu_erf(x[i]) = 0.5 x (1 + erf(x / sqrt 2)) for n elements.
void GeluErf(float* x, int64_t n);

// In place RoPE on x [rows, n_heads * head_dim] at positions[r] (absolute, 0-based).
void RopeRows(float* x, const int32_t* positions, int rows, int n_heads, int head_dim, float theta);
// The same rotation on adjacent pairs (2i, 2i + 1) instead of halves (Huginn-0125's RoPE).
void RopePairsRows(float* x, const int32_t* positions, int rows, int n_heads, int head_dim,
                   float theta);

// out[r, :] = table[ids[r], :] for a row-major fp32 table [vocab, dim]. Aborts on an id
// outside [0, vocab).
void EmbeddingGather(const float* table, int64_t vocab, const int32_t* ids, int rows, int dim,
                     float* out);
// Same from a checkpoint tensor [vocab, dim] of F32, BF16 or F16 (converted exactly to fp32).
void EmbeddingGather(const TensorView& table, const int32_t* ids, int rows, float* out);

}  // namespace morserve
