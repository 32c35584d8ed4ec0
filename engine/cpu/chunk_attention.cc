// Accumulators and folds of one recurrent prefill chunk (see chunk_attention.h).
#include "engine/cpu/chunk_attention.h"

#include <algorithm>
#include <limits>

#include "engine/core/check.h"

namespace morserve {

ChunkAttention::ChunkAttention(const ChunkAttentionParams& p)
    : p_(p), avx2_(p.allow_avx2 && CpuHasAvx2()) {
  MORSERVE_CHECK(p.pool != nullptr && p.n >= 0 && p.first >= 0, "bad chunk attention params");
  MORSERVE_CHECK(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0, "n_kv_heads must divide n_heads");
  MORSERVE_CHECK(p.pool->kv_heads == p.n_kv_heads && p.pool->head_dim == p.head_dim,
                 "chunk attention params do not match the KV pool shape");
  MORSERVE_CHECK(static_cast<int64_t>(p.first) + p.n <= static_cast<int64_t>(p.num_blocks) * group(),
                 "the chunk's entries exceed its block table");
  const int hd = p.head_dim;
  const size_t blocks = (p.n + kLanes - 1) / kLanes;
  const size_t per_block = static_cast<size_t>(p.n_heads) * hd * kLanes;
  q_lanes_.assign(blocks * per_block, 0.0f);
  acc_.assign(blocks * per_block, 0.0f);
  max_.assign(blocks * p.n_heads * kLanes, -std::numeric_limits<float>::infinity());
  sum_.assign(blocks * p.n_heads * kLanes, 0.0f);
  for (int i = 0; i < p.n; ++i) {
    float* block = &q_lanes_[(i / kLanes) * per_block];
    const float* row = p.q + static_cast<size_t>(i) * p.n_heads * hd;
    for (int e = 0; e < p.n_heads * hd; ++e) block[static_cast<size_t>(e) * kLanes + i % kLanes] = row[e];
  }
}

LaneBlock ChunkAttention::Block(int b) {
  const size_t per_block = static_cast<size_t>(p_.n_heads) * p_.head_dim * kLanes;
  LaneBlock lb;
  lb.q = &q_lanes_[b * per_block];
  lb.acc = &acc_[b * per_block];
  lb.max = &max_[static_cast<size_t>(b) * p_.n_heads * kLanes];
  lb.sum = &sum_[static_cast<size_t>(b) * p_.n_heads * kLanes];
  return lb;
}

// Runs fn(SoftmaxState&) on a contiguous copy of one (query, head) state, then stores it back.
template <typename Fn>
void ChunkAttention::WithState(int i, int head, Fn fn) {
  const int hd = p_.head_dim, lane = i % kLanes;
  LaneBlock b = Block(i / kLanes);
  thread_local std::vector<float> contiguous;
  contiguous.resize(hd);
  float* a = contiguous.data();
  float* lanes = b.acc + static_cast<size_t>(head) * hd * kLanes + lane;
  for (int d = 0; d < hd; ++d) a[d] = lanes[d * kLanes];
  SoftmaxState st;
  st.max = b.max[head * kLanes + lane];
  st.sum = b.sum[head * kLanes + lane];
  st.acc = a;
  fn(st);
  b.max[head * kLanes + lane] = st.max;
  b.sum[head * kLanes + lane] = st.sum;
  for (int d = 0; d < hd; ++d) lanes[d * kLanes] = a[d];
}

// As PagedAttention folds one block of a row: per kv head, per query head of its group.
void ChunkAttention::FoldGroupScalar(int i, int start, int count) {
  const PagedKvPool& kv = *p_.pool;
  const int hd = p_.head_dim, group_heads = p_.n_heads / p_.n_kv_heads;
  const int64_t base = static_cast<int64_t>(p_.blocks[start / group()]) * group() + start % group();
  MORSERVE_CHECK(base >= 0 && base + count <= kv.num_slots(), "block id outside the pool");
  thread_local std::vector<float> scores;
  thread_local std::vector<const float*> values;
  scores.resize(std::max(count, 1));
  values.resize(std::max(count, 1));
  const float* q_row = p_.q + static_cast<size_t>(i) * p_.n_heads * hd;
  for (int kvh = 0; kvh < p_.n_kv_heads; ++kvh) {
    for (int j = 0; j < count; ++j) values[j] = kv.ValueAt(base + j, kvh);
    for (int g = 0; g < group_heads; ++g) {
      const int head = kvh * group_heads + g;
      const float* q = q_row + static_cast<size_t>(head) * hd;
      for (int j = 0; j < count; ++j) scores[j] = AttentionDot(q, kv.KeyAt(base + j, kvh), hd) * p_.scale;
      WithState(i, head, [&](SoftmaxState& st) { FoldChunk(st, scores.data(), values.data(), count, hd); });
    }
  }
}

void ChunkAttention::FoldKeys(int key_begin, int key_end, int q_begin, int q_end,
                              ThreadPool* threads) {
  const int g = group();
  MORSERVE_CHECK(0 <= key_begin && key_begin <= key_end && key_begin % g == 0 && key_end % g == 0,
                 "key range must be whole groups");
  MORSERVE_CHECK(0 <= q_begin && q_begin <= q_end && q_end <= p_.n, "query range outside the chunk");
  if (key_begin == key_end || q_begin == q_end) return;
  MORSERVE_CHECK(key_end <= GroupStart(p_.first + q_begin), "keys must precede the queries' groups");
  KeyGroups keys;
  keys.pool = p_.pool;
  keys.blocks = p_.blocks;
  keys.key_begin = key_begin;
  keys.key_end = key_end;
  keys.n_heads = p_.n_heads;
  keys.n_kv_heads = p_.n_kv_heads;
  keys.scale = p_.scale;
  const int first_block = q_begin / kLanes, last_block = (q_end - 1) / kLanes;
  auto body = [&](int64_t u_begin, int64_t u_end) {
    for (int64_t u = u_begin; u < u_end; ++u) {
      const int b = first_block + static_cast<int>(u);
      const int lo = std::max(q_begin, b * kLanes), hi = std::min(q_end, (b + 1) * kLanes);
      if (avx2_) {
        LaneBlock lb = Block(b);
        lb.lane_begin = lo - b * kLanes;
        lb.lane_end = hi - b * kLanes;
        FoldKeyGroupsAvx2(keys, lb);
        continue;
      }
      for (int i = lo; i < hi; ++i) {
        for (int start = key_begin; start < key_end; start += g) FoldGroupScalar(i, start, g);
      }
    }
  };
  const int64_t units = last_block - first_block + 1;
  if (threads == nullptr || units == 1) {
    body(0, units);
  } else {
    threads->ParallelFor(units, body);
  }
}

void ChunkAttention::Finish(int i, float* out) {
  MORSERVE_CHECK(0 <= i && i < p_.n, "query outside the chunk");
  const int slot = p_.first + i, start = GroupStart(slot);
  if (slot > start) FoldGroupScalar(i, start, slot - start);
  const int hd = p_.head_dim, group_heads = p_.n_heads / p_.n_kv_heads;
  const size_t kv_stride = static_cast<size_t>(p_.n_kv_heads) * hd;
  const float* q_row = p_.q + static_cast<size_t>(i) * p_.n_heads * hd;
  for (int head = 0; head < p_.n_heads; ++head) {
    const int kvh = head / group_heads;
    const float* k = p_.extra_k + i * kv_stride + static_cast<size_t>(kvh) * hd;
    const float* v = p_.extra_v + i * kv_stride + static_cast<size_t>(kvh) * hd;
    const float score = AttentionDot(q_row + static_cast<size_t>(head) * hd, k, hd) * p_.scale;
    WithState(i, head, [&](SoftmaxState& st) {
      FoldChunk(st, &score, &v, 1, hd);
      NormaliseState(st, hd, out + static_cast<size_t>(head) * hd);
    });
  }
}

}  // namespace morserve
