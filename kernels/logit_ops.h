// The per-id operations of the sampler's stages before temperature, as the host stages them
// for the device (engine/cuda/sample_staging.h) and logit_process.cuh applies them. Plain C++
// (no CUDA header), so the engine's host code builds them without the toolkit.
#pragma once

#include <cstdint>

namespace morserve::kernels {

enum LogitOpFlags : uint32_t {
  kLogitOpAllowed = 1,  // in allowed_token_ids (kept when the row masks)
  kLogitOpBias = 2,     // logit_bias has it
  kLogitOpBanned = 4,   // min_tokens not reached: an eos or stop id
  kLogitOpSeen = 8,     // penalised: in the output, or in the prompt with the repetition penalty
};

struct LogitOp {
  int32_t id = 0;
  uint32_t flags = 0;  // LogitOpFlags
  float bias = 0.0f;   // with kLogitOpBias
  int32_t count = 0;   // times in the output (with kLogitOpSeen)
};

// One processed row: its source logits row, its ops [op_begin, op_end) and its penalties.
struct LogitRowProcess {
  int32_t src_row = 0;
  int32_t op_begin = 0, op_end = 0;
  int32_t masked = 0;       // allowed_token_ids given: ids without kLogitOpAllowed are -inf
  float repetition = 1.0f;  // 1: off
  float frequency = 0.0f;
  float presence = 0.0f;
};

}  // namespace morserve::kernels
