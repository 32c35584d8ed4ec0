// The exact tiled prefill schedule of a recurrent layer
// (docs/models.md#recurrent-transformer-layers) over one chunk of a request's positions, on
// the CPU.
//
// Position t needs the persistent pairs of every earlier position, and those exist only after
// the earlier positions have run the whole layer, so the per-position GEMVs (Wo, MLP, the
// persistent K/V projection) stay sequential. The attention need not be: with one
// online-softmax accumulator per query (ChunkAttention), a key can be folded into a query as
// soon as it exists. The schedule:
//   1. fold the pairs cached before the chunk into all n queries (one pass over the cache);
//   2. Solve(leaves [a, b)): Solve(left half); fold the left half's new pairs into the right
//      half's accumulators as one dense tile (every pair is causal: key before query);
//      Solve(right half). A leaf is one KV block's worth of positions, finished one by one:
//      its own partial block and temporary pair are folded, then `finish` runs the rest of
//      the layer and writes the persistent pair.
// Every (query, key) pair is folded exactly once, key groups in increasing order, so the
// result is bit-identical to the one-position-at-a-time schedule (chunk_attention.h). What
// the schedule buys: the attention work leaves the sequential path. The naive schedule reads
// all earlier K/V rows once per position, one query at a time; here the tiles are dense
// rectangles (no causal mask inside), each K/V row once loaded serves a block of 8 queries
// (one per AVX2 lane), and with a tile's keys kept in fast memory for all of its queries
// (GPU shared memory) the K/V traffic is O(n log n) rows instead of O(n^2). Only the
// per-position GEMVs stay sequential.
#pragma once

#include <functional>

#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/thread_pool.h"

namespace morserve {

// finish(i, attn) completes position i from its attention output attn[n_heads * head_dim]:
// it must write position i's persistent pair at slot index first + i before it returns.
using FinishPosition = std::function<void(int i, const float* attn)>;

void RunTiledPrefill(ChunkAttention& attention, ThreadPool* threads, const FinishPosition& finish);

}  // namespace morserve
