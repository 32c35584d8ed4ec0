// Embedding gather: out[r, :] = table[ids[r], :] for a bf16 table [vocab, dim] (a checkpoint's
// embed_tokens, uploaded as is), into an fp32 or bf16 activation [rows, dim]; fp32 output may
// be scaled: float(double(x) * scale) (Huginn-0125's sqrt(H), ScaleEmbedding's rounding).
//
// Exact: bf16 -> fp32 widening is exact, bf16 -> bf16 is a copy and the scale is one fp64
// product rounded once, so results are bitwise equal to the CPU backend's EmbeddingGather (and
// ScaleEmbedding) and trivially batch invariant.
//
// Ids are validated where requests enter the engine; an id outside [0, vocab) that still
// reaches the kernel fills its output row with NaN (a device kernel cannot report an error
// per row, and NaN makes the fault visible in the logits rather than reading out of bounds).
//
// Grid: one CTA per row. When dim is a multiple of 8 and both buffers are 16-byte aligned, a
// bf16 -> bf16 gather copies 16-byte vectors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct EmbeddingParams {
  const uint16_t* table = nullptr;  // [vocab, dim] bf16 bits
  const int32_t* ids = nullptr;     // [rows], device memory
  void* out = nullptr;              // [rows, dim], out_dtype (kF32 or kBF16)
  int rows = 0;                     // 0 is allowed (nothing is launched)
  int dim = 0;
  int64_t vocab = 0;
  DType out_dtype = DType::kF32;
  double scale = 1.0;  // kF32 output only
};

// Launches on `stream`. Returns cudaErrorInvalidValue for an unsupported out_dtype, a scale
// other than 1 with bf16 output, a null pointer or a non-positive dim/vocab, else the launch's
// error.
cudaError_t embedding_forward(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
