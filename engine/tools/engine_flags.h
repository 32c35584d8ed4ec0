// Engine settings from command-line flags, shared by `generate` and `bench`:
//   --mode depth|sequence  --weights auto|f32|bf16|f16|int8  --max-batch N  --max-step-tokens N
//   --max-running N  --block-size N  --kv-blocks N  --kv-cache-mb N  --threads N
//   --device cpu|cuda (cuda: builds with MORSERVE_CUDA on a machine with a Hopper GPU)
//   --recurrent-prefill tiled|naive  --prefix-cache on|off (default on)
//   --cuda-graphs on|off (default on: decode-sized passes replay captured CUDA graphs)
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/engine_config.h"
#include "engine/tools/flags.h"

namespace morserve {

const std::set<std::string>& EngineFlagNames();
absl::StatusOr<EngineConfig> EngineConfigFromFlags(const Flags& flags);
absl::StatusOr<BatchingMode> ParseBatchingMode(const std::string& s);
const char* BatchingModeName(BatchingMode m);
absl::StatusOr<CpuWeights> ParseCpuWeights(const std::string& s);  // --weights
const char* CpuWeightsName(CpuWeights w);

}  // namespace morserve
