// AVX-512 kernel of paged_attention_lanes.h: one row per lane, each lane exactly the per-row
// unit's operations (AttentionDot, FoldChunk, NormaliseState of online_softmax.h).
#include <algorithm>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/paged_attention_lanes.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {

bool CpuHasAttentionLanes() { return __builtin_cpu_supports("avx512f"); }

MORSERVE_BEGIN_TARGET("avx512f")

namespace {

constexpr int kL = kAttentionLanes;

// ExpF (online_softmax.h) per lane: the same operations in the same order.
__m512 ExpLanes16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 low = _mm512_maskz_mov_ps(nan, x);  // NaN stays NaN, the rest of !keep gives 0
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));    // keeps the discarded lanes finite
  x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
  const __m512 fn = _mm512_roundscale_ps(
      _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(fn, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(fn, _mm512_set1_ps(-2.12194440e-4f)));
  const __m512 z = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, z), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  const __m512i n = _mm512_cvttps_epi32(fn);
  const __m512 pow2 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  return _mm512_mask_mov_ps(low, keep, _mm512_mul_ps(p, pow2));
}

// AttentionDot(q_lane, key, hd) * scale for every lane; q is [hd][kL]: 8 partial sums over
// blocks of 8 elements, then the tail, then the same tree.
__m512 DotLanes16(const float* q, const float* key, int hd, float scale) {
  __m512 part[8];
  for (__m512& v : part) v = _mm512_setzero_ps();
  int i = 0;
  for (; i + 8 <= hd; i += 8) {
    for (int j = 0; j < 8; ++j) {
      part[j] = _mm512_add_ps(
          part[j], _mm512_mul_ps(_mm512_loadu_ps(q + (i + j) * kL), _mm512_set1_ps(key[i + j])));
    }
  }
  for (int j = 0; i < hd; ++i, ++j) {
    part[j] =
        _mm512_add_ps(part[j], _mm512_mul_ps(_mm512_loadu_ps(q + i * kL), _mm512_set1_ps(key[i])));
  }
  const __m512 sum = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(part[0], part[1]), _mm512_add_ps(part[2], part[3])),
      _mm512_add_ps(_mm512_add_ps(part[4], part[5]), _mm512_add_ps(part[6], part[7])));
  return _mm512_mul_ps(sum, _mm512_set1_ps(scale));
}

struct LaneScratch {
  std::vector<float> q, acc, scores, weights;
  std::vector<__mmask16> valid;  // per entry of a chunk: the lanes that fold it
};

// The running state of one query head for every lane.
struct LaneState {
  __m512 max;  // -inf before the first chunk
  __m512 sum;
  float* acc;  // [hd][kL]
};

// The value update of a chunk, per element d: the correction first, then the entries in
// order, as FoldChunk does; entry j reaches the lanes of valid[j].
void AccumulateValues(const float* v0, int64_t v_stride, int cnt, int hd, __mmask16 active,
                      const __mmask16* valid, __m512 correction, const float* weights, float* acc) {
  for (int d = 0; d < hd; ++d) {
    __m512 a = _mm512_loadu_ps(acc + d * kL);
    a = _mm512_mask_mul_ps(a, active, a, correction);
    for (int j = 0; j < cnt; ++j) {
      const __m512 wv =
          _mm512_mul_ps(_mm512_loadu_ps(weights + j * kL), _mm512_set1_ps(v0[j * v_stride + d]));
      a = _mm512_mask_add_ps(a, valid[j], a, wv);
    }
    _mm512_storeu_ps(acc + d * kL, a);
  }
}

// The same for a chunk of 16 entries that every active lane folds whole (every chunk of a
// prefill but the diagonal ones): the 16 weights stay in registers.
void AccumulateValuesFull16(const float* v0, int64_t v_stride, int hd, __mmask16 active,
                            __m512 correction, const float* weights, float* acc) {
  __m512 w[16];
  for (int j = 0; j < 16; ++j) w[j] = _mm512_loadu_ps(weights + j * kL);
  for (int d = 0; d < hd; ++d) {
    __m512 a = _mm512_loadu_ps(acc + d * kL);
    a = _mm512_mask_mul_ps(a, active, a, correction);
    for (int j = 0; j < 16; ++j) {
      a = _mm512_mask_add_ps(a, active, a,
                             _mm512_mul_ps(w[j], _mm512_set1_ps(v0[j * v_stride + d])));
    }
    _mm512_storeu_ps(acc + d * kL, a);
  }
}

// FoldChunk of entries [0, cnt) of the chunk at physical slot `base` for the lanes in
// `active`; lane l folds only its first counts[l] entries (lanes with 0 are not active).
void FoldLanes(const PagedKvPool& kv, int64_t base, int cnt, int kv_head, __m512i counts,
               __mmask16 active, const float* q, float scale, LaneState& st, LaneScratch& s) {
  const int hd = kv.head_dim;
  bool whole = true;  // every active lane folds all cnt entries
  for (int j = 0; j < cnt; ++j) {
    s.valid[j] = _mm512_cmpgt_epi32_mask(counts, _mm512_set1_epi32(j));
    whole = whole && s.valid[j] == active;
  }
  __m512 chunk_max = st.max;
  for (int j = 0; j < cnt; ++j) {
    const __m512 score = DotLanes16(q, kv.KeyAt(base + j, kv_head), hd, scale);
    _mm512_storeu_ps(&s.scores[static_cast<size_t>(j) * kL], score);
    chunk_max = _mm512_mask_max_ps(chunk_max, s.valid[j], score, chunk_max);  // std::max(max, s)
  }
  const __m512 correction = ExpLanes16(_mm512_sub_ps(st.max, chunk_max));
  __m512 sum = _mm512_mask_mul_ps(st.sum, active, st.sum, correction);
  for (int j = 0; j < cnt; ++j) {
    const __m512 w = ExpLanes16(
        _mm512_sub_ps(_mm512_loadu_ps(&s.scores[static_cast<size_t>(j) * kL]), chunk_max));
    sum = _mm512_mask_add_ps(sum, s.valid[j], sum, w);
    _mm512_storeu_ps(&s.weights[static_cast<size_t>(j) * kL], w);
  }
  const float* v0 = kv.ValueAt(base, kv_head);
  const int64_t v_stride = kv.kv_dim();  // the entries of one block are consecutive slots
  if (whole && cnt == 16) {
    AccumulateValuesFull16(v0, v_stride, hd, active, correction, s.weights.data(), st.acc);
  } else {
    AccumulateValues(v0, v_stride, cnt, hd, active, s.valid.data(), correction, s.weights.data(),
                     st.acc);
  }
  st.sum = sum;
  st.max = _mm512_mask_mov_ps(st.max, active, chunk_max);
}

}  // namespace

void AttendLanesAvx512(const PagedAttentionParams& p, const AttentionLaneRows& rows, int kv_head) {
  MORSERVE_CHECK(p.extra_k == nullptr, "attention lanes: rows with an extra pair");
  const int n = rows.row_end - rows.row_begin;
  MORSERVE_CHECK(n >= 1 && n <= kL, "attention lanes: 1 to 16 rows");
  const PagedKvPool& kv = *p.pool;
  const int hd = p.head_dim, bs = kv.block_size, group = p.n_heads / p.n_kv_heads;
  const size_t q_stride = static_cast<size_t>(p.n_heads) * hd;
  thread_local LaneScratch s;
  s.q.assign(static_cast<size_t>(hd) * kL, 0.0f);
  s.acc.resize(static_cast<size_t>(hd) * kL);
  s.scores.resize(static_cast<size_t>(bs) * kL);
  s.weights.resize(static_cast<size_t>(bs) * kL);
  s.valid.resize(static_cast<size_t>(bs));
  alignas(64) int32_t len[kL] = {};
  int max_len = 0;
  for (int l = 0; l < n; ++l) {
    len[l] = p.kv_len[rows.row_begin + l];
    max_len = std::max(max_len, len[l]);
  }
  const __m512i lens = _mm512_load_si512(len);
  for (int g = 0; g < group; ++g) {
    const int head = kv_head * group + g;
    for (int l = 0; l < n; ++l) {
      const float* q = p.q + (rows.row_begin + l) * q_stride + static_cast<size_t>(head) * hd;
      for (int d = 0; d < hd; ++d) s.q[static_cast<size_t>(d) * kL + l] = q[d];
    }
    std::fill(s.acc.begin(), s.acc.end(), 0.0f);
    LaneState st{_mm512_set1_ps(-__builtin_inff()), _mm512_setzero_ps(), s.acc.data()};
    for (int start = 0; start < max_len; start += bs) {
      // Entries of this chunk per lane: clamp(len - start, 0, bs).
      const __m512i counts =
          _mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(lens, _mm512_set1_epi32(start)),
                                            _mm512_setzero_si512()),
                           _mm512_set1_epi32(bs));
      const __mmask16 active = _mm512_cmpgt_epi32_mask(counts, _mm512_setzero_si512());
      const int64_t base = static_cast<int64_t>(rows.blocks[start / bs]) * bs;
      const int cnt = std::min(bs, max_len - start);
      MORSERVE_CHECK(base >= 0 && base + cnt <= kv.num_slots(), "block id outside the pool");
      FoldLanes(kv, base, cnt, kv_head, counts, active, s.q.data(), p.scale, st, s);
    }
    // NormaliseState: out = acc * (sum > 0 ? 1 / sum : 0).
    const __m512 inv = _mm512_maskz_div_ps(
        _mm512_cmp_ps_mask(st.sum, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f), st.sum);
    alignas(64) float out[kL];
    for (int d = 0; d < hd; ++d) {
      _mm512_store_ps(out, _mm512_mul_ps(_mm512_loadu_ps(st.acc + d * kL), inv));
      for (int l = 0; l < n; ++l) {
        p.out[(rows.row_begin + l) * q_stride + static_cast<size_t>(head) * hd + d] = out[l];
      }
    }
  }
}

MORSERVE_END_TARGET

}  // namespace morserve
