// AVX2 lane kernels of attention, one query per lane: ChunkAttention's fold (see
// chunk_attention_avx2.h) and PagedAttention's runs of rows over one table
// (paged_attention_lanes.h, AttendLanesAvx2). Compiled for AVX2 without FMA (and with
// -ffp-contract=off) so every lane rounds exactly like the scalar code.
#include "engine/cpu/chunk_attention_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/paged_attention_lanes.h"
#include "engine/cpu/simd_target.h"

namespace morserve {

bool CpuHasAvx2() { return __builtin_cpu_supports("avx2"); }

MORSERVE_BEGIN_TARGET("avx2")

namespace {

// ExpF (online_softmax.h) per lane, same operations in the same order.
__m256 ExpLanes(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 low = _mm256_and_ps(nan, x);      // NaN stays NaN, the rest of !keep gives 0
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // keeps the discarded lanes finite
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 fn = _mm256_floor_ps(
      _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(fn, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(fn, _mm256_set1_ps(-2.12194440e-4f)));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, z), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvttps_epi32(fn);
  const __m256 pow2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_blendv_ps(low, _mm256_mul_ps(p, pow2), keep);
}

// AttentionDot(q_lane, key, hd) * scale for every lane: 8 partial sums, same tree.
__m256 DotLanes(const float* q, const float* key, int hd, float scale) {
  __m256 part[8];
  for (__m256& v : part) v = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= hd; i += 8) {
    for (int j = 0; j < 8; ++j) {
      part[j] = _mm256_add_ps(part[j], _mm256_mul_ps(_mm256_loadu_ps(q + (i + j) * kLanes),
                                                     _mm256_set1_ps(key[i + j])));
    }
  }
  for (int j = 0; i < hd; ++i, ++j) {
    part[j] = _mm256_add_ps(part[j],
                            _mm256_mul_ps(_mm256_loadu_ps(q + i * kLanes), _mm256_set1_ps(key[i])));
  }
  const __m256 sum = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(part[0], part[1]), _mm256_add_ps(part[2], part[3])),
      _mm256_add_ps(_mm256_add_ps(part[4], part[5]), _mm256_add_ps(part[6], part[7])));
  return _mm256_mul_ps(sum, _mm256_set1_ps(scale));
}

// FoldChunk for every lane of one head over `count` entries from physical slot `base`; acc is
// [head_dim][kLanes], scratch [2][count][kLanes]. The value loop runs per element d over all
// entries (acc[d] is loaded and stored once per group): each element still sees the
// correction first and then the entries in order, as in FoldChunk.
void FoldGroupLanes(const PagedKvPool& kv, int64_t base, int count, int kv_head, const float* q,
                    float scale, float* acc, __m256* max, __m256* sum, float* scratch) {
  const int hd = kv.head_dim;
  float* scores = scratch;
  float* weights = scratch + count * kLanes;
  __m256 chunk_max = *max;
  for (int j = 0; j < count; ++j) {
    const __m256 s = DotLanes(q, kv.KeyAt(base + j, kv_head), hd, scale);
    _mm256_storeu_ps(scores + j * kLanes, s);
    chunk_max = _mm256_max_ps(s, chunk_max);  // as std::max(chunk_max, s): chunk_max on ties
  }
  const __m256 correction = ExpLanes(_mm256_sub_ps(*max, chunk_max));
  __m256 total = _mm256_mul_ps(*sum, correction);
  for (int j = 0; j < count; ++j) {
    const __m256 w = ExpLanes(_mm256_sub_ps(_mm256_loadu_ps(scores + j * kLanes), chunk_max));
    total = _mm256_add_ps(total, w);
    _mm256_storeu_ps(weights + j * kLanes, w);
  }
  const float* v0 = kv.ValueAt(base, kv_head);
  const int64_t v_stride = kv.kv_dim();  // entries of one block are consecutive slots
  for (int d = 0; d < hd; ++d) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d * kLanes), correction);
    for (int j = 0; j < count; ++j) {
      a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(weights + j * kLanes),
                                         _mm256_set1_ps(v0[j * v_stride + d])));
    }
    _mm256_storeu_ps(acc + d * kLanes, a);
  }
  *sum = total;
  *max = chunk_max;
}

}  // namespace

void FoldKeyGroupsAvx2(const KeyGroups& keys, const LaneBlock& block) {
  const PagedKvPool& kv = *keys.pool;
  const int hd = kv.head_dim, g = kv.block_size, group_heads = keys.n_heads / keys.n_kv_heads;
  thread_local std::vector<float> acc, scratch;
  acc.resize(static_cast<size_t>(hd) * kLanes);
  scratch.resize(static_cast<size_t>(2) * g * kLanes);
  int32_t mask_bits[kLanes];
  for (int l = 0; l < kLanes; ++l)
    mask_bits[l] = l >= block.lane_begin && l < block.lane_end ? -1 : 0;
  const __m256 mask =
      _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mask_bits)));
  for (int head = 0; head < keys.n_heads; ++head) {
    const int kv_head = head / group_heads;
    const float* q = block.q + static_cast<size_t>(head) * hd * kLanes;
    float* acc_out = block.acc + static_cast<size_t>(head) * hd * kLanes;
    std::copy_n(acc_out, acc.size(), acc.data());
    __m256 max = _mm256_loadu_ps(block.max + head * kLanes),
           sum = _mm256_loadu_ps(block.sum + head * kLanes);
    for (int start = keys.key_begin; start < keys.key_end; start += g) {
      const int64_t base = static_cast<int64_t>(keys.blocks[start / g]) * g;
      MORSERVE_CHECK(base >= 0 && base + g <= kv.num_slots(), "block id outside the pool");
      FoldGroupLanes(kv, base, g, kv_head, q, keys.scale, acc.data(), &max, &sum, scratch.data());
    }
    for (int d = 0; d < hd; ++d) {
      float* out = acc_out + d * kLanes;
      _mm256_storeu_ps(
          out, _mm256_blendv_ps(_mm256_loadu_ps(out), _mm256_loadu_ps(&acc[d * kLanes]), mask));
    }
    float* m = block.max + head * kLanes;
    float* s = block.sum + head * kLanes;
    _mm256_storeu_ps(m, _mm256_blendv_ps(_mm256_loadu_ps(m), max, mask));
    _mm256_storeu_ps(s, _mm256_blendv_ps(_mm256_loadu_ps(s), sum, mask));
  }
}

namespace {

// a + b in the lanes of m (all-ones lanes), a elsewhere: the add's bits where it happens.
__m256 MaskAdd(__m256 a, __m256 m, __m256 b) { return _mm256_blendv_ps(a, _mm256_add_ps(a, b), m); }
__m256 MaskMul(__m256 a, __m256 m, __m256 b) { return _mm256_blendv_ps(a, _mm256_mul_ps(a, b), m); }

struct PagedLaneScratch {
  std::vector<float> q, acc, scores, weights;
  std::vector<float> valid;  // [entry][kLanes]: all-ones in the lanes that fold the entry
};

// FoldChunk of entries [0, cnt) of the chunk at physical slot `base` for the lanes in
// `active`; lane l folds only its first counts[l] entries (as AVX-512's FoldLanes).
void FoldPagedLanes(const PagedKvPool& kv, int64_t base, int cnt, int kv_head, __m256i counts,
                    __m256 active, const float* q, float scale, __m256* max, __m256* sum,
                    float* acc, PagedLaneScratch& s) {
  const int hd = kv.head_dim;
  auto valid = [&](int j) { return _mm256_loadu_ps(&s.valid[static_cast<size_t>(j) * kLanes]); };
  for (int j = 0; j < cnt; ++j) {
    _mm256_storeu_ps(&s.valid[static_cast<size_t>(j) * kLanes],
                     _mm256_castsi256_ps(_mm256_cmpgt_epi32(counts, _mm256_set1_epi32(j))));
  }
  __m256 chunk_max = *max;
  for (int j = 0; j < cnt; ++j) {
    const __m256 score = DotLanes(q, kv.KeyAt(base + j, kv_head), hd, scale);
    _mm256_storeu_ps(&s.scores[static_cast<size_t>(j) * kLanes], score);
    // std::max(chunk_max, score) in the valid lanes: chunk_max on ties and NaN scores.
    chunk_max = _mm256_blendv_ps(chunk_max, _mm256_max_ps(score, chunk_max), valid(j));
  }
  const __m256 correction = ExpLanes(_mm256_sub_ps(*max, chunk_max));
  __m256 total = MaskMul(*sum, active, correction);
  for (int j = 0; j < cnt; ++j) {
    const __m256 w = ExpLanes(
        _mm256_sub_ps(_mm256_loadu_ps(&s.scores[static_cast<size_t>(j) * kLanes]), chunk_max));
    total = MaskAdd(total, valid(j), w);
    _mm256_storeu_ps(&s.weights[static_cast<size_t>(j) * kLanes], w);
  }
  const float* v0 = kv.ValueAt(base, kv_head);
  const int64_t v_stride = kv.kv_dim();  // the entries of one block are consecutive slots
  for (int d = 0; d < hd; ++d) {         // per element: the correction, then the entries in order
    __m256 a = MaskMul(_mm256_loadu_ps(acc + d * kLanes), active, correction);
    for (int j = 0; j < cnt; ++j) {
      const __m256 wv = _mm256_mul_ps(_mm256_loadu_ps(&s.weights[static_cast<size_t>(j) * kLanes]),
                                      _mm256_set1_ps(v0[j * v_stride + d]));
      a = MaskAdd(a, valid(j), wv);
    }
    _mm256_storeu_ps(acc + d * kLanes, a);
  }
  *sum = total;
  *max = _mm256_blendv_ps(*max, chunk_max, active);
}

}  // namespace

void AttendLanesAvx2(const PagedAttentionParams& p, const AttentionLaneRows& rows, int kv_head) {
  MORSERVE_CHECK(p.extra_k == nullptr, "attention lanes: rows with an extra pair");
  const int n = rows.row_end - rows.row_begin;
  MORSERVE_CHECK(n >= 1 && n <= kLanes, "attention lanes (AVX2): 1 to 8 rows");
  const PagedKvPool& kv = *p.pool;
  const int hd = p.head_dim, bs = kv.block_size, group = p.n_heads / p.n_kv_heads;
  const size_t q_stride = static_cast<size_t>(p.n_heads) * hd;
  thread_local PagedLaneScratch s;
  s.q.assign(static_cast<size_t>(hd) * kLanes, 0.0f);
  s.acc.resize(static_cast<size_t>(hd) * kLanes);
  s.scores.resize(static_cast<size_t>(bs) * kLanes);
  s.weights.resize(static_cast<size_t>(bs) * kLanes);
  s.valid.resize(static_cast<size_t>(bs) * kLanes);
  alignas(32) int32_t len[kLanes] = {};
  int max_len = 0;
  for (int l = 0; l < n; ++l) {
    len[l] = p.kv_len[rows.row_begin + l];
    max_len = std::max(max_len, len[l]);
  }
  const __m256i lens = _mm256_load_si256(reinterpret_cast<const __m256i*>(len));
  for (int g = 0; g < group; ++g) {
    const int head = kv_head * group + g;
    for (int l = 0; l < n; ++l) {
      const float* q = p.q + (rows.row_begin + l) * q_stride + static_cast<size_t>(head) * hd;
      for (int d = 0; d < hd; ++d) s.q[static_cast<size_t>(d) * kLanes + l] = q[d];
    }
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    __m256 max = _mm256_set1_ps(-__builtin_inff()), sum = _mm256_setzero_ps();
    for (int start = 0; start < max_len; start += bs) {
      // Entries of this chunk per lane: clamp(len - start, 0, bs).
      const __m256i counts =
          _mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(lens, _mm256_set1_epi32(start)),
                                            _mm256_setzero_si256()),
                           _mm256_set1_epi32(bs));
      const __m256 active = _mm256_castsi256_ps(_mm256_cmpgt_epi32(counts, _mm256_setzero_si256()));
      const int64_t base = static_cast<int64_t>(rows.blocks[start / bs]) * bs;
      const int cnt = std::min(bs, max_len - start);
      MORSERVE_CHECK(base >= 0 && base + cnt <= kv.num_slots(), "block id outside the pool");
      FoldPagedLanes(kv, base, cnt, kv_head, counts, active, s.q.data(), p.scale, &max, &sum,
                     s.acc.data(), s);
    }
    // NormaliseState: out = acc * (sum > 0 ? 1 / sum : 0).
    const __m256 positive = _mm256_cmp_ps(sum, _mm256_setzero_ps(), _CMP_GT_OQ);
    const __m256 inv =
        _mm256_blendv_ps(_mm256_setzero_ps(), _mm256_div_ps(_mm256_set1_ps(1.0f), sum), positive);
    alignas(32) float out[kLanes];
    for (int d = 0; d < hd; ++d) {
      _mm256_store_ps(out,
                      _mm256_mul_ps(_mm256_loadu_ps(&s.acc[static_cast<size_t>(d) * kLanes]), inv));
      for (int l = 0; l < n; ++l) {
        p.out[(rows.row_begin + l) * q_stride + static_cast<size_t>(head) * hd + d] = out[l];
      }
    }
  }
}

MORSERVE_END_TARGET

}  // namespace morserve
