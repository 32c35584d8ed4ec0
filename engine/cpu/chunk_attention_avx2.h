// The AVX2 kernel of ChunkAttention (chunk_attention.h): folds key groups into the states of
// one block of kLanes queries at once, one query per vector lane. Each lane performs exactly
// the operations of AttentionDot and FoldChunk (online_softmax.h) in the same order, with
// separate multiplies and adds and ExpLanes matching ExpF, so its bits equal the scalar
// path's. Callers check CpuHasAvx2() first.
#pragma once

#include <cstdint>

#include "engine/cpu/paged_attention.h"

namespace morserve {

constexpr int kLanes = 8;

// One block of kLanes queries, every array lane-minor: value (head, d) of lane l is at
// [(head * head_dim + d) * kLanes + l].
struct LaneBlock {
  const float* q = nullptr;  // [n_heads][head_dim][kLanes], RoPE applied
  float* acc = nullptr;      // [n_heads][head_dim][kLanes]
  float* max = nullptr;      // [n_heads][kLanes]
  float* sum = nullptr;      // [n_heads][kLanes]
  int lane_begin = 0;        // lanes whose state is updated (others are left as they are)
  int lane_end = kLanes;
};

struct KeyGroups {
  const PagedKvPool* pool = nullptr;
  const int32_t* blocks = nullptr;  // block table: group g lives in block blocks[g]
  int key_begin = 0;                // group-aligned slot indices
  int key_end = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  float scale = 1.0f;
};

bool CpuHasAvx2();
void FoldKeyGroupsAvx2(const KeyGroups& keys, const LaneBlock& block);

}  // namespace morserve
