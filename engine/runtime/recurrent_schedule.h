// The exact tiled schedule of a recurrent layer's batch
// (docs/models.md#recurrent-transformer-layers), one for both backends: which key tiles merge into
// which pending queries when. The CPU runner runs it with tiles of one KV block
// (engine/cpu/recurrent_prefill.h, ChunkAttention's key groups), the GPU runner with tiles of
// kRecurrentGpuTile entries (engine/cuda/recurrent_staging.h, kernels/recurrent_attention.cuh),
// after cutting its merges into ranges of kRecurrentGpuRange keys (SplitRecurrentMerges).
// Plain C++, unit-tested without a device (tests/unit/recurrent_schedule_test.cc).
//
// Rows come in chunks (LayerKvPlan::chunk_indptr): chunk c is n_c consecutive entries
// first_c .. first_c + n_c - 1 of one request's cache slot (a decode row is a chunk of one).
// Position i of a chunk can finish only after position i - 1 wrote its persistent pair, so the
// batch runs in waves: wave w holds position w of every chunk with n_c > w, and the rows are
// reordered wave-major (`order`), so each wave is one contiguous range of rows for the GEMMs.
//
// Merges work on tiles of T (`tile`) entries aligned at multiples of T. For a chunk whose first
// tile is u0 = first / T:
//   - before wave 0, every query merges the cached whole tiles [0, u0 T);
//   - when the chunk-relative tile u (entries [(u0 + u) T, (u0 + u + 1) T)) is complete (its
//     last entry written by the wave that just ran), with k = ctz(u + 1): the tiles
//     [u + 1 - 2^k, u + 1) merge into the queries of tiles [u + 1, u + 1 + 2^k), as items of
//     the next wave (a Fenwick / divide-and-conquer order: exactly one k per completed tile);
//   - finish: the query's own partial tile and temporary pair.
// Each (query, key tile) pair below the query's own tile is merged exactly once: by the tile
// pair's highest differing bit of the chunk-relative indices. A query receives its tiles in
// increasing order (higher bits first, which are the lower keys). So a backend that folds a
// merge's keys tile by tile, in order, gives every query the folds of the one-position-at-a-time
// schedule and the same bits. A key tile of 2^k T entries is read once per query of a 2^k T
// block, and each level holds about n / 2 queries, so the merges move O(n log n) state and the
// sequential path (finish) reads at most T keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace morserve {

// The item layout of kernels/recurrent_attention.cuh (RecurrentFoldItem), repeated here because
// this file is built without CUDA; the GPU runner and the kernel tests static_assert that they
// agree. `flags` is kRecurrentScheduleFresh on a row's first fold (bookkeeping: the GPU kernels
// do not read it, a range's partial opens at the range's first key).
inline constexpr int32_t kRecurrentScheduleFresh = 1;
struct RecurrentFold {
  int32_t row = 0;
  int32_t key_begin = 0;
  int32_t key_end = 0;
  int32_t flags = 0;
};

struct RecurrentSchedule {
  std::vector<int> order;       // new row j is old row order[j] (wave-major)
  std::vector<int> wave_begin;  // wave w is new rows [wave_begin[w], wave_begin[w + 1])
  // Merges to run before wave w's finish: merge[merge_begin[w] .. merge_begin[w + 1]).
  std::vector<RecurrentFold> merge;
  std::vector<int> merge_begin;
  // finish[j] finishes new row j (so wave w's are finish[wave_begin[w] .. wave_begin[w + 1])).
  std::vector<RecurrentFold> finish;
  int waves() const { return static_cast<int>(wave_begin.size()) - 1; }
};

// Builds the schedule of n rows with their entry indices kv_len (old row order) for tiles of
// `tile` entries (> 0). chunk_indptr empty: every row is a chunk of one. Returns false with
// *error set when the chunks do not cover the rows or a chunk's rows are not consecutive entries.
bool BuildRecurrentSchedule(const std::vector<int32_t>& chunk_indptr, const int32_t* kv_len, int n,
                            int tile, RecurrentSchedule* out, std::string* error);

// Cuts every merge of s at the multiples of `range` (a positive multiple of the tile) into pieces
// in key order, in the same wave, the first piece keeping the merge's flags. The GPU keeps one
// softmax partial per (query, range) and combines a query's ranges in range order at its
// finish (kernels/recurrent_attention.cuh): the pieces of one merge target different partials, so
// they run as parallel items of one launch (a decode row's cached prefix: one item per range).
// Each partial still receives its tiles once, in increasing order. The CPU runs the schedule
// uncut (one running state per query).
void SplitRecurrentMerges(int range, RecurrentSchedule* s);

}  // namespace morserve
