// The CPU backend: ModelRunner over oneDNN GEMMs (weights reordered once at load, fp32 or
// bf16), fp32 row-wise ops and fp32 online-softmax paged attention. Every op computes a
// row from that row's data alone in a fixed order, so a request's numbers do not depend on
// its batch neighbours. Rows arrive grouped by loop: tied projections run once over every
// row; untied copies run per group of rows at the same loop; Relaxed models' LoRA deltas
// (scale * (x A^T) B^T) run per loop group on top of the shared base GEMM. Recurrent layers
// run decode rows as one batch and each request's prefill chunk by the tiled schedule
// (recurrent_prefill.h) or, with RecurrentPrefill::kNaive, one position at a time.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks);

}  // namespace morserve
