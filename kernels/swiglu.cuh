// SwiGLU on the fused gate/up GEMM output: out[r, i] = silu(gate[r, i]) * up[r, i] with
//   gate_up[r] = [ gate (inter) | up (inter) ],   silu(g) = g / (1 + exp(-g)).
//
// Precision: inputs bf16 or fp32 widened to fp32, silu and the product in fp32 (expf, IEEE
// division), output rounded once to its dtype. The CPU backend (SiluMulRows) evaluates in
// double; the difference is fp32 rounding (a few ulp).
//
// Batch invariance: elementwise, each output depends only on its two inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct SwigluParams {
  const void* gate_up = nullptr;  // [rows, 2 * inter], in_dtype (kF32 or kBF16)
  void* out = nullptr;            // [rows, inter], out_dtype (kF32 or kBF16); may not alias
  int rows = 0;                   // 0 is allowed (nothing is launched)
  int inter = 0;
  DType in_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a bad dtype, a null pointer or a
// non-positive inter, else the launch's error.
cudaError_t swiglu_forward(const SwigluParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
