// Host-side translation of one ModelRunner call's row metadata into the flat int32 array the
// CUDA backend copies to the device in one transfer (plain C++, unit-tested without a GPU):
// loops, positions and the LayerKvPlan arrays (write_slot, table_indptr, table_blocks,
// kv_len), each starting on a 16-byte boundary, plus what the launches need on the host:
// the largest kv_len (sizes the attention grid) and the runs of rows at the same loop
// (per-loop weights run once per run), which also go to the device as segments
// (seg_indptr, seg_loop) for the segmented LoRA kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/layer_batch.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

struct StagedRows {
  std::vector<int32_t> data;  // everything below, one H2D copy
  size_t loops = 0, positions = 0, write_slot = 0, table_indptr = 0, table_blocks = 0, kv_len = 0;
  size_t seg_indptr = 0, seg_loop = 0;  // groups as [groups + 1] row bounds and [groups] loops
  int max_kv_len = 0;
  std::vector<LoopGroup> groups;
};

// Stages a layer batch. Errors (never a crash) when the plan's arrays do not match n rows,
// indptr is not non-decreasing from 0 to table_blocks.size(), a loop is outside
// [0, num_loops), or a kv_len is negative or beyond the row's table capacity
// (blocks * block_size). table_capacity > 0: table_blocks takes that many entries (zeros
// after the rows' blocks; more blocks than that is an error), so the offsets after it do not
// depend on the rows' tables.
absl::StatusOr<StagedRows> StageLayerBatch(const LayerBatch& b, int num_loops, int block_size,
                                           size_t table_capacity = 0);

// A layer batch of 1..rows rows staged as `rows` rows with a table of table_capacity blocks,
// for a captured step (engine/cuda/cuda_step_graphs.h): the offsets then depend only on (rows,
// the number of loop groups, table_capacity). The padding rows take the last row's loop (so
// the group count is the batch's), position 0, no cache write (write_slot -1) and no entry
// (kv_len 0, no block): their outputs are never read, and no live row reads them.
absl::StatusOr<StagedRows> StagePaddedLayerBatch(const LayerBatch& b, int num_loops, int block_size,
                                                 int rows, size_t table_capacity);

// Stages only loops (router calls) or nothing but groups; `loops` may be null (all loop 0).
StagedRows StageLoops(const int* loops, int n);

// Appends `part`'s arrays to into->data (16-byte aligned) and returns `part` with every
// offset rebased onto into->data, so several stagings travel in one upload (the recurrent
// layer's per-wave loop runs ride with the layer's rows).
StagedRows AppendStaged(StagedRows part, StagedRows* into);

// Recurrent prefill chunks run one position at a time (correct first; a tiled schedule is a
// later step): wave j holds the j-th row of every chunk, so a row's earlier chunk rows have
// written their persistent pairs before it attends. chunk_indptr as LayerKvPlan's
// (rows [indptr[c], indptr[c + 1]) form chunk c); empty: every row is its own chunk.
std::vector<std::vector<int>> RecurrentWaves(const std::vector<int32_t>& chunk_indptr, int n);

// Some rows of a layer batch as a batch of their own (copies of their loops, positions, h
// (none when b.h is null) and KV plan, tables re-based), and the copy of their h back into
// the full batch.
struct SubBatch {
  LayerKvPlan kv;
  std::vector<int> loops, positions;
  std::vector<float> h;
  LayerBatch b;
};
void MakeSubBatch(const LayerBatch& b, const std::vector<int>& rows, int hidden, SubBatch* out);
void ScatterSubBatch(const SubBatch& sub, const std::vector<int>& rows, int hidden, float* h);

}  // namespace morserve
