// `morserve inspect DIR`: what a checkpoint directory turns into once loaded. Prints the
// layer plan, parameter counts, which copies of shared layers were deduplicated and which
// are kept per loop, and the KV cache bytes per token. `--json` prints the same as one JSON
// object (tests parse it; its keys are listed in InspectJson).
#pragma once

#include <cstdint>
#include <string>

#include "engine/model/weights.h"
#include "nlohmann/json.hpp"

namespace morserve {

struct ParameterCounts {
  int64_t checkpoint = 0;           // every tensor in the files (all stored copies, buffers)
  int64_t stored = 0;               // after dedup: one per distinct view, LoRA, routers
  int64_t unrolled_equivalent = 0;  // a vanilla model of the same unrolled depth
};

// Parameters of one Llama block (two norms, attention, MLP), no LoRA.
int64_t LayerParameters(const ModelConfig& c);
ParameterCounts CountParameters(const ModelWeights& w);

// KV cache bytes per token at bf16: 2 (K and V) * kv_dim * 2 bytes.
int64_t KvBytesPerTokenPerSlot(const ModelConfig& c);

// Keys: dir, config, plan {describe, segments, looped_segment, num_layer_slots,
// num_cache_slots, num_unrolled_layers}, parameters {checkpoint, stored,
// unrolled_equivalent}, memory_bf16_bytes, lm_head_tied, dedup {deduplicated, untied},
// weights [{segment, layer, tensor, copies, lora}] for looped segments, routers,
// kv {dtype, bytes_per_token_per_slot, cache_slots, bytes_per_token}.
nlohmann::json InspectJson(const ModelWeights& w, const std::string& dir);
std::string InspectText(const nlohmann::json& j);

}  // namespace morserve
