// The layer plan of docs/models.md#layer-plan-and-sharing: a model is a list of segments,
// each a block of K layers run `loops` times. Unique layers are segments with loops == 1.
// This file also fixes the numbering everything else shares:
//   - layer slot: index of a weight position (segment s, layer k) in plan order;
//   - unrolled layer j: the checkpoint's model.layers.{j} for vanilla/Recursive layouts;
//   - cache slot: the KV slot a (segment, loop, k) reads and writes
//     (docs/models.md#kv-cache-modes).
// Loops are 0-based in code (the papers' r = 1 is loop 0).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"

namespace morserve {

struct Segment {
  int first_layer_slot = 0;  // layer slots first_layer_slot .. +num_layers-1
  int num_layers = 1;        // K
  int loops = 1;             // 1: unique layers
  int first_cache_slot = 0;
  bool looped() const { return loops > 1; }
};

struct LayerPlan {
  std::vector<Segment> segments;
  int looped_segment = -1;  // the single looped segment when exactly one exists, else -1
  int num_layer_slots = 0;
  int num_cache_slots = 0;
  KvMode kv = KvMode::kRecursionWise;
  Sharing sharing = Sharing::kNone;

  // Unrolled layer index j of (segment, loop, k), per the sharing strategy's table.
  int UnrolledLayer(int segment, int loop, int k) const;
  // KV cache slot used by (segment, loop, k): under kShared, loop > 0 reads loop 0's slot.
  int CacheSlot(int segment, int loop, int k) const;
  // Cache slots (segment, loop, k) that are written when running loop `loop` (kShared: loop 0
  // only writes; later loops write nothing).
  bool WritesKv(int segment, int loop) const {
    return kv == KvMode::kRecursionWise || loop == 0 || !segments[segment].looped();
  }
  int num_unrolled_layers() const;
  std::string Describe() const;  // human-readable, for `morserve inspect`
};

// Builds and validates the plan for a config. Errors name the field.
absl::StatusOr<LayerPlan> BuildLayerPlan(const ModelConfig& config);

}  // namespace morserve
