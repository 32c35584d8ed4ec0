// RMSNorm over the rows of a [rows, dim] activation, with an optional fused residual add:
//
//   without residual:  out[r] = w * (x[r] * inv(x[r]))
//   with residual:     residual[r] += x[r]  (fp32, in place)
//                      out[r] = w * (residual[r] * inv(residual[r]))
//   inv(h) = 1 / sqrt(sum(h^2) / dim + eps)
//
// The fused form is a layer's "x = x + Attn(...); m = RMSNorm_post(x)" in one pass: the
// residual stream stays fp32 while x (a projection's output) may be bf16.
//
// Batch invariance: one CTA per row, a block size that depends on nothing but the kernel
// (never on rows), and a fixed reduction order (each thread sums a fixed strided subset in
// index order, then a fixed shuffle tree, then the warps' partials summed in warp order). A
// row's bits therefore depend only on that row, the weights and dim, never on how many rows
// share the launch; tests/gpu/kernel_rmsnorm_test checks it.
//
// Precision: inputs bf16 or fp32, accumulation and the scaling in fp32, output rounded once
// to its dtype (bf16 round to nearest even). This differs from the CPU backend's double
// accumulation by fp32 rounding only.
//
// In place: out may alias x when both have the same dtype (each element is read and then
// written by the same thread). residual must not alias x or out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct RmsNormParams {
  const void* x = nullptr;       // [rows, dim], x_dtype (kF32 or kBF16)
  const void* weight = nullptr;  // [dim], weight_dtype (kF32 or kBF16)
  float* residual = nullptr;     // optional [rows, dim] fp32, updated in place (see above)
  void* out = nullptr;           // [rows, dim], out_dtype (kF32 or kBF16)
  int rows = 0;                  // 0 is allowed (nothing is launched)
  int dim = 0;
  float eps = 1e-6f;
  DType x_dtype = DType::kF32;
  DType weight_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a dtype other than F32/BF16, a
// null pointer or a negative size, else the launch's error (asynchronous errors surface at
// the next synchronisation, as usual).
cudaError_t rmsnorm_forward(const RmsNormParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
