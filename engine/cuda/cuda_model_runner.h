// The CUDA backend: ModelRunner on one GPU (Hopper, sm_90a), the twin of
// engine/cpu/cpu_model_runner.h with the kernels of kernels/. Weights are uploaded once as
// bf16 (q|k|v and gate|up fused, one copy per loop where the checkpoint's copies differ,
// Relaxed models' LoRA as one extra GEMM pair per loop group, tied lm_head reusing the
// embedding table); the KV cache is a device bf16 paged pool with the CPU pool's layout and
// the engine's block plan. GEMMs go through one cuBLASLt handle with one 32 MiB workspace and
// one algorithm pinned per shape, or the fixed-order GEMM (--cuda-gemm: kernels/gemm.cuh,
// kernels/fixed_gemm.cuh).
//
// Row states stay on the device (a pool of slots); a call uploads its rows' metadata once
// through a pinned arena and only calls that return data synchronise. Decode-sized segment
// passes replay CUDA graphs (cuda_step_graphs.h); sampling runs on the device (Sample). The
// design is in docs/design.md ("Runners"); its per-step counters in RunnerCounters::Device.
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
