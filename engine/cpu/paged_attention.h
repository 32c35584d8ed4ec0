// Paged KV storage and fp32 attention for the CPU backend.
//
// Pool layout: [num_blocks][block_size][kv_heads][head_dim] for k and for v. One token's
// entry for all kv heads is contiguous, so KvWrite is one copy per row, and one head's entry
// is head_dim contiguous floats (whole cache lines), so the strided read in attention is cheap.
// A slot is block_id * block_size + offset.
//
// Attention: each row has its own block table (flat indptr/indices arrays, FlashInfer style)
// and sees the entries at slot indices [0, kv_len[r]) of that table, then optionally one extra
// (k, v) pair of its own. Rows may belong to different sequences. Batch invariance: a row's
// result depends only on its q, its table, its kv_len and the pool contents; the work is split
// over (row, kv head) and each such unit runs on one thread with a fixed order: entries in
// slot order, online softmax updated once per KV block (chunks follow block boundaries, which
// depend only on the row's own slot indices), then the extra entry. All math is fp32.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/cpu/thread_pool.h"

namespace morserve {

struct PagedKvPool {
  int num_blocks = 0;
  int block_size = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::vector<float> k, v;  // [num_blocks][block_size][kv_heads][head_dim]

  int kv_dim() const { return kv_heads * head_dim; }
  int64_t num_slots() const { return static_cast<int64_t>(num_blocks) * block_size; }
  const float* KeyAt(int64_t slot, int kv_head) const {
    return k.data() + slot * kv_dim() + static_cast<int64_t>(kv_head) * head_dim;
  }
  const float* ValueAt(int64_t slot, int kv_head) const {
    return v.data() + slot * kv_dim() + static_cast<int64_t>(kv_head) * head_dim;
  }
};

// A zero-filled pool.
PagedKvPool MakePagedKvPool(int num_blocks, int block_size, int kv_heads, int head_dim);

// Copies row r of k_rows / v_rows ([rows, kv_dim]) to slot slot_mapping[r]; -1 skips the row.
// Aborts on a slot outside the pool.
void KvWrite(PagedKvPool& pool, const float* k_rows, const float* v_rows,
             const int32_t* slot_mapping, int rows);

struct PagedAttentionParams {
  int num_rows = 0;
  const float* q = nullptr;  // [rows, n_heads * head_dim]
  float* out = nullptr;      // [rows, n_heads * head_dim]
  const PagedKvPool* pool = nullptr;
  const int32_t* table_indptr = nullptr;  // [rows + 1]: row r's blocks are
  const int32_t* table_blocks = nullptr;  //   table_blocks[indptr[r] .. indptr[r+1])
  const int32_t* kv_len = nullptr;        // [rows]: entries visible to the row, from slot index 0
  // Optional [rows, kv_dim]: one more entry per row after the visible ones (the recurrent
  // layers' temporary pair); nullptr when unused.
  const float* extra_k = nullptr;
  const float* extra_v = nullptr;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;  // usually 1 / sqrt(head_dim)
};

// out = softmax(q · K^T * scale) · V per row and head; head h reads kv head
// h / (n_heads / n_kv_heads). A row that sees no entry gets zeros. threads == nullptr runs
// serially on the caller.
void PagedAttention(const PagedAttentionParams& p, ThreadPool* threads);

// The builds of the attention unit that the host runs ("baseline", then "avx2", "avx2-lanes",
// "avx512", "avx512-lanes"; a -lanes build is its unit with runs of rows that share a block
// table, such as a prefill chunk's, one row per vector lane of paged_attention_lanes.h): each
// gives the same bits. PagedAttention uses the widest, or the baseline / AVX2 lanes build when
// $MORSERVE_CPU_KERNELS is "scalar" / "avx2" (kernel_choice.h).
std::vector<std::string_view> PagedAttentionIsas();
// PagedAttention on one named build (for the tests that compare them).
void PagedAttentionWithIsa(const PagedAttentionParams& p, ThreadPool* threads,
                           std::string_view isa);

}  // namespace morserve
