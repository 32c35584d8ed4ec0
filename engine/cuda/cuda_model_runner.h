// The CUDA backend: ModelRunner on one GPU (Hopper, sm_90a), the twin of
// engine/cpu/cpu_model_runner.h with the kernels of kernels/. Weights are uploaded once as
// bf16 (q|k|v and gate|up fused, one copy per loop where the checkpoint's copies differ,
// Relaxed models' LoRA as one extra GEMM pair per loop group, tied lm_head reusing the
// embedding table); the KV cache is a device bf16 paged pool with the CPU pool's layout and
// the engine's block plan; GEMMs go through one cuBLASLt handle with one 32 MiB workspace.
//
// The interface passes the residual stream h as host fp32, so each call copies h (and the
// step's row metadata, in one array) to the device through pinned staging buffers, runs
// everything else on the device on one stream, and copies h back. That is the first,
// correct version; keeping h resident on the device across calls (and capturing the step in
// a CUDA graph) is the next step for speed.
//
// Compiled only when MORSERVE_CUDA is ON; this header is plain C++.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

// Errors (never aborts) when no usable device is present (none, or not compute capability
// 9.x), the model's shapes are outside what the kernels take (head_dim 64, 96 or 128, GQA group
// <= 8, hidden / intermediate / vocab multiples of 8), or the weights and KV pool do not fit.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks);

}  // namespace morserve
