// Paged varlen attention over bf16 KV blocks, the GPU twin of engine/cpu/paged_attention:
// the same step plan (per row: table_indptr / table_blocks / kv_len, optional extra pair),
// the same pool layout [num_blocks][block_size][n_kv_heads][head_dim] (bf16 here), so a
// prefill chunk (many rows of one request, kv_len growing by one per row: causal by
// position) and decode rows (one per request) run in one launch.
//
//   out[r, h] = softmax(q[r, h] · K_r^T * scale) · V_r,   K_r, V_r = the row's visible entries
//   (slot indices [0, kv_len[r]) of its table) followed by its extra pair when extra_k is set.
//   Head h reads kv head h / (n_heads / n_kv_heads). A row that sees no entry gets zeros.
//
// Design (FlashDecoding-style split-KV, CUDA cores, no tensor cores yet):
// - Split kernel, grid (rows, n_kv_heads, max_chunks), 128 threads: one CTA per (row, kv
//   head, chunk) holds all query heads of the GQA group, so K/V of a kv head is read once
//   per row. A chunk is `chunk_len` consecutive entries of the row (a FIXED number of
//   tokens, never a fixed number of splits), walked in tiles of kAttentionTile keys with an
//   fp32 online softmax (base 2, scale * log2(e) folded into the scores), double-buffered:
//   the next tile's key addresses and K/V parts load while the current tile is folded
//   (attention_tile.cuh FoldTiles; the sums' order is the unpipelined walk's). head_dim 64, 96 or
//   128: a key is scored by 8, 16 or 16 lanes of 8 elements each (for 96, 12 lanes hold the
//   row and 4 add zeros), the same CTA and tile for all three (kernels/attention_tile.cuh).
// - Combine kernel, grid (rows, n_heads): merges a row's chunk partials in chunk order
//   (kernels/attention_combine.cuh, the code recurrent_attention's finish runs on its ranges).
//   A row with a single chunk is written directly by the split kernel and skipped here.
//
// Batch invariance: a row's bits depend only on its q, its table, kv_len, extra pair, the
// pool contents and chunk_len. Chunk boundaries are multiples of chunk_len in the row's own
// entry index, tiles are kAttentionTile keys from the chunk start, every reduction (the
// 8-element per-lane dot, the lane butterfly, the softmax max/sum trees, the per-key PV
// accumulation in key order, the chunk merge in chunk order) has a fixed order, and nothing
// depends on rows, max_kv_len or the other rows' lengths (these only size the grid; CTAs
// past a row's last chunk exit at once).
//
// Precision: bf16 q/K/V widened exactly to fp32; scores, softmax and accumulation in fp32;
// out rounded once to bf16 (or stored as fp32).
//
// Graph capture: no allocation, no host synchronisation; metadata is read from the
// caller's device buffers, and the partials go to a caller-provided workspace. The grid
// depends on (rows, n_kv_heads, max_kv_len) only, so a captured launch stays valid while
// every row keeps kv_len <= max_kv_len.
//
// Faults a device cannot report per row (validated where the engine builds its plan, but
// made visible here rather than read out of bounds): kv_len < 0, kv_len beyond the row's
// table capacity, more chunks than max_kv_len allows, or a block id outside [0, num_blocks)
// fill the row's output with NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

// Keys per inner tile; chunk_len must be a positive multiple of it.
inline constexpr int kAttentionTile = 32;
// Largest GQA group (query heads per kv head) the kernel holds in one CTA.
inline constexpr int kAttentionMaxGroup = 8;

// How the split kernel walks a chunk's tiles. Both are fixed-order and batch invariant; their
// bits differ (a row keeps the same bits only under one fold).
//   kCta:  the CTA on one tile at a time, pipelined one tile ahead (attention_tile.cuh).
//          Recurrent layers use it: their ranges must equal recurrent_attention's folds.
//   kWarp: each of the CTA's 4 warps walks its own tiles (tile index within the chunk mod 4)
//          with its own softmax state, merged in warp order at the chunk's end
//          (attention_warp_fold.cuh): a quarter of the serial walk, for small batches.
enum class AttentionFold : int32_t { kCta = 0, kWarp = 1 };

// The head_dims the attention kernels (this one and recurrent_attention) are built for.
inline constexpr bool AttentionHeadDimSupported(int head_dim) {
  return head_dim == 64 || head_dim == 96 || head_dim == 128;
}

struct PagedAttentionParams {
  const uint16_t* q = nullptr;            // [rows, n_heads * head_dim] bf16
  const uint16_t* k_cache = nullptr;      // [num_blocks, block_size, n_kv_heads, head_dim] bf16
  const uint16_t* v_cache = nullptr;      // same layout
  const int32_t* table_indptr = nullptr;  // [rows + 1]: row r's blocks are
  const int32_t* table_blocks = nullptr;  //   table_blocks[indptr[r] .. indptr[r + 1])
  const int32_t* kv_len = nullptr;        // [rows]: entries visible to the row, from index 0
  // Optional [rows, n_kv_heads * head_dim] bf16: one more entry per row after the visible
  // ones (recurrent layers' temporary pair); both or neither.
  const uint16_t* extra_k = nullptr;
  const uint16_t* extra_v = nullptr;
  void* out = nullptr;  // [rows, n_heads * head_dim], out_dtype (kBF16 or kF32)
  DType out_dtype = DType::kBF16;
  // PagedAttentionWorkspaceFloats(...) fp32 elements; may be null when max_chunks is 1.
  float* workspace = nullptr;
  int rows = 0;  // 0 is allowed (nothing is launched)
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // 64, 96 or 128 (AttentionHeadDimSupported)
  int block_size = 0;
  int num_blocks = 0;
  int max_kv_len = 0;  // >= every kv_len[r] of the launch; sizes the grid
  int chunk_len = 256;
  AttentionFold fold = AttentionFold::kCta;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
};

// Chunks the grid holds per row: ceil((max_kv_len + extra) / chunk_len), at least 1.
int PagedAttentionMaxChunks(int max_kv_len, bool extra, int chunk_len);

// fp32 elements of workspace a launch needs (0 when every row fits in one chunk).
size_t PagedAttentionWorkspaceFloats(int rows, int n_heads, int head_dim, int max_kv_len,
                                     bool extra, int chunk_len);

// Launches the split kernel and the combine kernel on `stream`. Returns
// cudaErrorInvalidValue for a null pointer, an unsupported head_dim / out_dtype, a GQA group
// over kAttentionMaxGroup, n_kv_heads not dividing n_heads, chunk_len not a multiple of
// kAttentionTile, an unknown fold, a missing workspace, a pointer that is not 16-byte aligned,
// or a grid over the device limits; otherwise the launches' error.
cudaError_t paged_attention_forward(const PagedAttentionParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
