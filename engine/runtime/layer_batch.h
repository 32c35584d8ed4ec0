// The backend-neutral part of running layers over a batch of rows, shared by the executor and
// both runners (each runner keeps only its ops): the runs of rows at one loop (per-loop
// weights run once per run), the layer call over the K/V-only or the full rows of a segment
// batch, and a KV plan restricted to some of its rows.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runtime/model_runner.h"

namespace morserve {

struct LoopGroup {
  int loop = 0;
  int begin = 0;
  int count = 0;
};

// Contiguous runs of rows at the same loop, in row order; `loops` may be null (all loop 0).
std::vector<LoopGroup> LoopGroups(const int* loops, int n);

// Layer k of a segment batch over its K/V-only rows [0, num_kv_only) or its full rows
// [num_kv_only, n), with their hidden states at `h` (the runner's copy of those rows).
LayerBatch KvOnlyLayer(const SegmentBatch& b, int k, float* h);
LayerBatch FullLayer(const SegmentBatch& b, int k, float* h);

// The rows `keep` of a layer plan, in that order, their entries and visible counts unchanged.
// A recurrent plan's rows are one unit (chunks): only all of them, in order, can be kept.
LayerKvPlan SelectPlanRows(const LayerKvPlan& kv, const std::vector<int>& keep);

}  // namespace morserve
