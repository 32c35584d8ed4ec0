// The sampler's stages before temperature on the device (engine/runtime/sampler.h: allowed
// ids -> logit bias -> min_tokens ban -> repetition, frequency and presence penalties), for
// the rows whose request uses one: out row i = logits row rows[i].src_row, processed. The
// sampling kernel (sampling.cuh) then chooses from the processed row and reports the raw
// logit of its choice.
//
// The host lists, per processed row, every vocabulary id a stage touches as one LogitOp (ids
// distinct within a row; the kernel does not check): allowed (kept when the row masks), a
// bias, banned (min_tokens not yet reached: eos and stop ids), seen (in the output, or in the
// prompt when the repetition penalty is on) with its output count. Every other id is the raw
// logit, or -inf when the row masks (allowed_token_ids given). Each op's value is the CPU
// sampler's, bit for bit, in its order (IEEE fp32, no contraction):
//   x = masked && !allowed ? -inf : raw
//   x = x + bias                                   (bias)
//   x = -inf                                       (banned)
//   x = x > 0 ? x / rep : x * rep                  (seen, rep != 1)
//   x = x - frequency * float(count)               (seen)
//   x = x - presence                               (seen, count > 0)
// An op whose id is outside [0, vocab) (a fault only the device could see) writes nothing.
//
// Grid: one CTA per processed row (a grid-stride loop past 4096 rows); the row's copy first,
// then its ops, one thread each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/logit_ops.h"

namespace morserve::kernels {

struct LogitProcessParams {
  const float* logits = nullptr;  // [*, row_stride] fp32, raw
  int64_t row_stride = 0;         // 0 means vocab
  int vocab = 0;
  float* out = nullptr;                   // [rows, vocab] fp32
  const LogitRowProcess* rows = nullptr;  // [n_rows] device
  int n_rows = 0;                         // 0 is allowed (nothing is launched)
  const LogitOp* ops = nullptr;           // device; may be null when no row has ops
};

// Launches on `stream`. cudaErrorInvalidValue for a negative n_rows, a non-positive vocab, a
// row_stride below vocab, or (n_rows > 0) a null logits, out or rows; otherwise the launch's
// error.
cudaError_t logit_process_forward(const LogitProcessParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
