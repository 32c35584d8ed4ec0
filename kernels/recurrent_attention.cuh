// Attention of recurrent layers (docs/models.md#recurrent-transformer-layers) through
// per-query online-softmax state, the GPU side of the exact tiled prefill (CPU:
// engine/cpu/chunk_attention.h).
//
// Each query row (one position of a recurrent chunk, or a decode row) owns a state per query
// head: running max m and sum l (base 2, as paged_attention) and the fp32 accumulator
// acc[head_dim]. Two launches work on it:
//   merge:  for each item (row, key_begin, key_end), fold the row's persistent entries
//           [key_begin, key_end) of its block table into its state, in tiles of
//           kRecurrentTile keys starting at key_begin. Both bounds are multiples of the tile,
//           and key_end <= the start of the tile that holds the row's own entry index
//           kv_len[row] (every key is written and causal). Flag kRecurrentFresh: start from
//           the empty state instead of loading it.
//   finish: for each item, fold the row's partial tile [kv_len - kv_len % tile, kv_len)
//           together with its temporary pair (extra_k/extra_v, at entry index kv_len) as one
//           tile, then write softmax(...)·V = acc / l to out (bf16 or fp32).
// The schedule (which items run when) is the caller's: engine/runtime/recurrent_schedule.h.
//
// Exactness: a tile's fold is the split kernel's own code (kernels/attention_tile.cuh
// FoldTile: per-lane 8-element dots, lane butterfly, warp max/sum, exp2f, key-ordered PV
// fmas, called by both kernels), and
// tiles are aligned at multiples of kRecurrentTile from entry 0. So when every tile below a
// row's own tile has been merged exactly once in increasing order, the row's output is bit for
// bit paged_attention's for that row with one split chunk (chunk_len >= kv_len + 1) and the
// same extra pair, whatever the schedule, the batch or the prefill chunking
// (tests/gpu/kernel_recurrent_attention_emu_test checks this on the emulator).
//
// One CTA of 128 threads per (item, kv head) holds the GQA group's query heads (<= 8), so a
// key tile is read once per row and kv head; rows of one request share tiles through L2.
//
// Faults the device sees (kv_len beyond the row's table, a block id outside the pool, a merge
// range that is not tile-aligned or not strictly before the row's own tile) poison the row's
// state (acc and l NaN), and finish writes NaN for a poisoned state, instead of reading out of
// bounds. Items with a row outside [0, rows) are skipped.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

// Keys per fold tile; equal to kAttentionTile (paged_attention.cuh) for the bitwise match.
inline constexpr int kRecurrentTile = 32;
inline constexpr int32_t kRecurrentFresh = 1;

struct RecurrentFoldItem {
  int32_t row = 0;
  int32_t key_begin = 0;  // merge only; finish derives its range from kv_len[row]
  int32_t key_end = 0;
  int32_t flags = 0;  // kRecurrentFresh
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
  float* state_ml = nullptr;                 // [rows, n_heads, 2]: m (base 2), l
  float* state_acc = nullptr;                // [rows, n_heads, head_dim]
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

// Both return cudaErrorInvalidValue for a null pointer the launch needs, head_dim not 64, 96 or
// 128 (AttentionHeadDimSupported, paged_attention.cuh), a GQA group over kAttentionMaxGroup or
// not dividing, a bad dtype, a non-finite scale, a pointer that is not 16-byte aligned, or more
// items than a grid holds; else the launch's error.
cudaError_t recurrent_attention_merge(const RecurrentAttentionParams& p, cudaStream_t stream);
cudaError_t recurrent_attention_finish(const RecurrentAttentionParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
