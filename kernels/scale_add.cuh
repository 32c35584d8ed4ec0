// Gated residual add: h[r, :] += scale[r] * b[r, :] on the fp32 residual stream.
//
// Covers the MoR steps RMSNorm does not: expert-choice gating after a loop
// (h = h + g_r * Block(h), ScaleAddRows in the CPU backend), token-choice's output
// (x0 + p * h: call with h = x0, b = h, scale = p) and the plain residual add (scale null:
// factor 1, AddRows).
//
// Precision: bitwise equal to the CPU backend's ScaleAddRows: the sum is
// float(double(h) + double(scale) * double(b)) with each double operation rounded once (no
// fused multiply-add); the product of two floats is exact in double. With scale null the
// result is the fp32 sum h + b, which double-then-float rounding reproduces exactly.
//
// Batch invariance: elementwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct ScaleAddParams {
  float* h = nullptr;            // [rows, dim] fp32, updated in place
  const void* b = nullptr;       // [rows, dim], b_dtype (kF32 or kBF16); must not alias h
  const float* scale = nullptr;  // optional [rows]; null means 1 for every row
  int rows = 0;                  // 0 is allowed (nothing is launched)
  int dim = 0;
  DType b_dtype = DType::kF32;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a bad dtype, a null pointer or a
// non-positive dim, else the launch's error.
cudaError_t scale_add_forward(const ScaleAddParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
