// The CPU backend: ModelRunner over the CPU linear kernels (cpu_linear.h: weights read in the
// checkpoint's dtype in place, or converted / int8-quantized once at load by --weights),
// fp32 row-wise ops and fp32 online-softmax paged attention. Every op computes a
// row from that row's data alone in a fixed order, so a request's numbers do not depend on
// its batch neighbours. Rows arrive grouped by loop: tied projections run once over every
// row; untied copies run per group of rows at the same loop; Relaxed models' LoRA deltas
// (scale * (x A^T) B^T) run per loop group on top of the shared base GEMM. Recurrent layers
// run decode rows as one batch and each request's prefill chunk by the tiled schedule
// (recurrent_prefill.h) or, with RecurrentPrefill::kNaive, one position at a time.
// K/V-only rows (early exit, exit_kv propagate) run RMSNorm_in, a K/V-only projection (the
// K and V rows of the fused QKV weight, their own primitives) and RoPE, and write their entry
// before the layer's full rows (they come first in a SegmentBatch). Row states live in one
// host array by slot; each call gathers its rows' states into a contiguous batch.
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
