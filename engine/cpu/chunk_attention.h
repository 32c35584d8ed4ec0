// Online-softmax accumulators of one recurrent prefill chunk, and the folds that fill them.
//
// A chunk is n consecutive entries of one request's cache slot: query i sits at slot index
// first + i and attends to the persistent entries at slot indices < first + i (those before
// `first` were cached by earlier steps, the others are written by the chunk's own earlier
// positions as they finish), then to its own temporary pair
// (docs/models.md#recurrent-transformer-layers).
//
// Invariant (bit-exactness): keys are folded in groups of block_size slot indices aligned to
// multiples of block_size, in increasing order, each group into a query exactly once; the
// group holding the query's own slot is folded partially, last, followed by the temporary
// pair. These are exactly the chunks PagedAttention folds for a single row with the same
// kv_len and extra pair, through the same AttentionDot / FoldChunk (online_softmax.h). So a
// query's output is bit-identical to the one-position-at-a-time path, whatever schedule
// decides when each group reaches which queries, and does not depend on where a prefill
// chunk starts or ends.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cpu/chunk_attention_avx2.h"
#include "engine/cpu/online_softmax.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/thread_pool.h"

namespace morserve {

struct ChunkAttentionParams {
  const PagedKvPool* pool = nullptr;
  const int32_t* blocks = nullptr;  // the request's block table for this cache slot
  int num_blocks = 0;
  int first = 0;  // slot index of query 0 (entries cached before the chunk)
  int n = 0;      // queries
  const float* q = nullptr;        // [n, n_heads * head_dim], RoPE applied
  const float* extra_k = nullptr;  // [n, n_kv_heads * head_dim]: the temporary pairs
  const float* extra_v = nullptr;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
  bool allow_avx2 = true;  // false: the scalar path only (tests compare the two bitwise)
};

class ChunkAttention {
 public:
  explicit ChunkAttention(const ChunkAttentionParams& p);

  int group() const { return p_.pool->block_size; }
  int first() const { return p_.first; }
  int n() const { return p_.n; }
  int attn_width() const { return p_.n_heads * p_.head_dim; }
  // First slot index of the group that holds slot index s.
  int GroupStart(int s) const { return s - s % group(); }

  // Folds the key groups in slot indices [key_begin, key_end) into queries [q_begin, q_end).
  // Both bounds are group-aligned, and every key precedes the group of query q_begin (so
  // every key is written and causal for every query). Work is split over blocks of kLanes
  // queries, one query per vector lane where the CPU has AVX2; each query's fold order is
  // fixed, so the result depends neither on the thread count nor on the instruction set.
  void FoldKeys(int key_begin, int key_end, int q_begin, int q_end, ThreadPool* threads);

  // Completes query i once every entry before slot first + i is written and every earlier
  // group has been folded into it: folds the partial group of its own slot and its temporary
  // pair, and writes softmax(...)·V for all heads to out[n_heads * head_dim].
  void Finish(int i, float* out);

 private:
  // Lane-minor state of query i (chunk_attention_avx2.h layout): block i / kLanes, lane i % kLanes.
  LaneBlock Block(int b);
  // Folds `count` entries from group-aligned slot index `start` into query i, one lane at a time.
  void FoldGroupScalar(int i, int start, int count);
  template <typename Fn>
  void WithState(int i, int head, Fn fn);

  ChunkAttentionParams p_;
  bool avx2_;
  std::vector<float> q_lanes_;    // [blocks][n_heads][head_dim][kLanes], zero-padded
  std::vector<float> acc_;        // [blocks][n_heads][head_dim][kLanes]
  std::vector<float> max_, sum_;  // [blocks][n_heads][kLanes]
};

}  // namespace morserve
