// Host side of a recurrent layer call on the GPU by the tiled schedule: the batch reordered
// into waves (engine/runtime/recurrent_schedule.h), its merges cut into ranges of
// kRecurrentGpuRange keys (SplitRecurrentMerges: one softmax partial per range, so a decode
// row's cached prefix is one parallel item per range), its rows staged for one upload with the
// merge and finish items and every wave's own loop runs appended (plain C++, unit-tested
// without a device: tests/unit/recurrent_staging_test.cc). CudaModelRunner::RunRecurrentTiled
// uploads `rows.data` once and launches from the offsets here.
#pragma once

#include <string>
#include <vector>

#include "engine/cuda/step_staging.h"
#include "engine/runtime/recurrent_schedule.h"

namespace morserve {

// The GPU's merge tile in entries: kernels/recurrent_attention.cuh's kRecurrentTile (the runner
// static_asserts that they agree; this file is built without CUDA).
inline constexpr int kRecurrentGpuTile = 32;
// The GPU's range in entries: kernels/recurrent_attention.cuh's kRecurrentRange (likewise).
inline constexpr int kRecurrentGpuRange = 256;

struct RecurrentStaging {
  RecurrentSchedule sched;  // merges cut into ranges
  SubBatch sub;             // the batch's rows in wave-major order (sched.order), h included
  StagedRows rows;          // sub staged, plus the items and the waves' loop runs (one upload)
  size_t merge_at = 0, finish_at = 0;  // int32 offsets of the item arrays (4 int32 per item)
  std::vector<StagedRows> waves;       // wave w's rows alone (loop runs from 0), rebased
  RecurrentStaging() = default;
  RecurrentStaging(const RecurrentStaging&) = delete;  // sub.b points into sub
  RecurrentStaging& operator=(const RecurrentStaging&) = delete;
};

// Fills *out for layer batch b (a recurrent layer: kv->chunk_indptr as the engine plans it).
// False with *error set when the chunks or the plan are malformed.
bool StageRecurrentLayer(const LayerBatch& b, int num_loops, int block_size, int hidden,
                         RecurrentStaging* out, std::string* error);

}  // namespace morserve
