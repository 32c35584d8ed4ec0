// Attention of recurrent layers (docs/models.md#recurrent-transformer-layers) through
// per-query online-softmax partials, the GPU side of the exact tiled prefill (CPU:
// engine/cpu/chunk_attention.h).
//
// A query row (one position of a recurrent chunk, or a decode row) at entry index len = kv_len
// attends to its entries [0, len) and its temporary pair (extra_k/extra_v, as entry len). Those
// len + 1 keys are cut into RANGES of kRecurrentRange keys aligned at multiples of it from entry 0
// (fixed: never a count of splits); range j of the row has its own partial per query head,
// running max m and sum l (base 2, as paged_attention) and the fp32 accumulator acc[head_dim],
// in the caller's workspace (RecurrentAttentionWorkspaceFloats: paged attention's partials
// layout). Two launches work on them:
//   merge:  for each item (row, key_begin, key_end), fold the row's persistent entries
//           [key_begin, key_end) of its block table into the partial of the range holding them,
//           in tiles of kRecurrentTile keys starting at key_begin. Both bounds are multiples of
//           the tile, the item lies inside one range (the schedule cuts its merges there:
//           SplitRecurrentMerges), and key_end <= the start of the tile that holds the row's own
//           entry index kv_len[row] (every key is written and causal). A merge starting at a
//           range's first key opens its partial from the empty state; any other loads it. So
//           the items of one launch may share a row as long as they target different ranges:
//           a decode row's cached prefix is one item per range, in parallel CTAs.
//   finish: for each item, fold the row's partial tile [kv_len - kv_len % tile, kv_len) and its
//           temporary pair into its own range's partial, then write softmax(...)·V (bf16 or
//           fp32): acc / l when the row has one range, else its ranges' partials combined in
//           range order (kernels/attention_combine.cuh CombineChunks, the paged combine's code).
// The schedule (which items run when) is the caller's: engine/runtime/recurrent_schedule.h.
//
// Exactness: a tile's fold is the split kernel's own code (kernels/attention_tile.cuh FoldTiles),
// tiles are aligned at multiples of kRecurrentTile from entry 0, and partials are stored,
// loaded and combined by the paged kernels' own functions (attention_combine.cuh). So when every
// tile below a row's own tile has been merged exactly once, each range's tiles in increasing
// order, the row's output is bit for bit paged_attention's for that row with chunk_len =
// kRecurrentRange and the same extra pair, whatever the schedule, the batch or the prefill
// chunking (tests/gpu/kernel_recurrent_attention_emu_test checks this on the emulator).
//
// One CTA of 128 threads per (item, kv head) holds the GQA group's query heads (<= 8), so a
// key tile is read once per row and kv head; rows of one request share tiles through L2.
//
// Faults the device sees (kv_len beyond the row's table or the workspace's ranges, a block id
// outside the pool, a merge range that is not tile-aligned, empty, across a range edge or not
// strictly before the row's own tile) poison a partial of the row (its sum NaN; range 0 when the
// item's own range is outside the workspace), and finish writes NaN for a row whose partials it
// reads include a poisoned one, instead of reading out of bounds. Items with a row outside
// [0, rows) are skipped.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

// Keys per fold tile; equal to kAttentionTile (paged_attention.cuh) for the bitwise match.
inline constexpr int kRecurrentTile = 32;
// Keys per range (a multiple of the tile): the reference is paged attention with this chunk_len.
inline constexpr int kRecurrentRange = 256;

struct RecurrentFoldItem {
  int32_t row = 0;
  int32_t key_begin = 0;  // merge only; finish derives its range from kv_len[row]
  int32_t key_end = 0;
  // Not read: whether a merge opens its partial follows from key_begin (the schedule's
  // kRecurrentScheduleFresh rides along so that its items upload as they are).
  int32_t flags = 0;
};
static_assert(sizeof(RecurrentFoldItem) == 16, "items are staged as 4 int32 each");

struct RecurrentAttentionParams {
  const uint16_t* q = nullptr;        // [rows, n_heads * head_dim] bf16, RoPE applied
  const uint16_t* k_cache = nullptr;  // [num_blocks, block_size, n_kv_heads, head_dim] bf16
  const uint16_t* v_cache = nullptr;
  const int32_t* table_indptr = nullptr;  // [rows + 1], as paged_attention
  const int32_t* table_blocks = nullptr;
  const int32_t* kv_len = nullptr;    // [rows]: the row's own entry index
  const uint16_t* extra_k = nullptr;  // [rows, n_kv_heads * head_dim] bf16 (finish)
  const uint16_t* extra_v = nullptr;
  // RecurrentAttentionWorkspaceFloats(rows, n_heads, head_dim, max_kv_len) fp32 elements: the
  // rows' range partials, kept from a row's first merge to its finish.
  float* workspace = nullptr;
  int max_kv_len = 0;                        // >= every kv_len[row]; sizes the workspace
  const RecurrentFoldItem* items = nullptr;  // device array of num_items
  int num_items = 0;                         // 0 is allowed (nothing is launched)
  void* out = nullptr;                       // finish: [rows, n_heads * head_dim], out_dtype
  DType out_dtype = DType::kBF16;
  int rows = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // 64, 96 or 128
  int block_size = 0;
  int num_blocks = 0;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
};

// Ranges per row of a launch whose rows have kv_len <= max_kv_len: ceil((max_kv_len + 1) /
// kRecurrentRange), the paged kernel's chunks with the extra pair.
int RecurrentAttentionMaxRanges(int max_kv_len);

// fp32 elements of workspace a launch over `rows` rows needs (every row has a partial per range,
// even when it has one range: it carries the fold from the merges to the finish).
size_t RecurrentAttentionWorkspaceFloats(int rows, int n_heads, int head_dim, int max_kv_len);

// Both return cudaErrorInvalidValue for a null pointer the launch needs, head_dim not 64, 96 or
// 128 (AttentionHeadDimSupported, paged_attention.cuh), a GQA group over kAttentionMaxGroup or
// not dividing, a bad dtype, a non-finite scale, a negative max_kv_len, a pointer that is not
// 16-byte aligned, or more items than a grid holds; else the launch's error.
cudaError_t recurrent_attention_merge(const RecurrentAttentionParams& p, cudaStream_t stream);
cudaError_t recurrent_attention_finish(const RecurrentAttentionParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
