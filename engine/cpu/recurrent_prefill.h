// The recurrent layer's exact tiled schedule (engine/runtime/recurrent_schedule.h, shared with
// the GPU runner) run on the CPU, with tiles of one KV block: ChunkAttention's key groups
// (docs/models.md#recurrent-transformer-layers).
//
// Position t needs the persistent pairs of every earlier position, and those exist only after
// the earlier positions have run the whole layer, so the per-position GEMVs (Wo, MLP, the
// persistent K/V projection) stay sequential within a chunk; the schedule's waves run them
// for one position of every chunk at once. The attention need not be sequential: with one
// online-softmax accumulator per query (ChunkAttention), a key group is folded into a query as
// soon as it exists, and the schedule's merges fold whole tiles into many queries as dense
// rectangles (no causal mask inside): each K/V row once loaded serves a block of 8 queries (one
// per AVX2 lane). Every (query, key group) pair is folded exactly once, groups in increasing
// order, so the result is bit-identical to the one-position-at-a-time schedule
// (chunk_attention.h), whatever the batch holds beside the chunk.
#pragma once

#include <functional>
#include <vector>

#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/thread_pool.h"
#include "engine/runtime/recurrent_schedule.h"

namespace morserve {

// Where each row of a schedule (old row order) keeps its accumulator: the chunk's
// ChunkAttention and the row's query index in it. A null attention: the row's attention is
// computed elsewhere (a chunk of one, by paged attention: the same folds) and its merges are
// skipped.
struct TiledRows {
  std::vector<ChunkAttention*> attention;
  std::vector<int> query;
};

// finish(rows, n, attn) completes a wave's n rows (old row indices, in wave order) from their
// attention outputs attn[n, attn_width] (rows without an attention have their attn row zeroed,
// for the callback to fill): it must write their persistent pairs before it returns.
using FinishWave = std::function<void(const int* rows, int n, float* attn)>;

// Runs schedule s (built with tiles of the chunks' group()) wave by wave: its merges, then the
// wave's finishes.
void RunTiledSchedule(const RecurrentSchedule& s, const TiledRows& rows, int attn_width,
                      ThreadPool* threads, const FinishWave& finish);

// One chunk alone: finish(i, attn) completes position i from its attention output
// attn[n_heads * head_dim] and must write its persistent pair at slot index first + i.
using FinishPosition = std::function<void(int i, const float* attn)>;
void RunTiledPrefill(ChunkAttention& attention, ThreadPool* threads, const FinishPosition& finish);

}  // namespace morserve
