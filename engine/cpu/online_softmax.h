// Online-softmax pieces shared by every CPU attention path: the fixed-order dot product that
// scores one entry, and the fold of one chunk of scored entries into a query head's running
// (max, sum, weighted values). The paged decode attention and the recurrent tiled prefill
// both use them, so two paths that fold the same chunks in the same order into a query give
// bit-identical results (the recurrent schedules rely on this; see chunk_attention.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace morserve {

// Dot product with 8 interleaved partial sums combined in a fixed order (vectorisable, and the
// order depends only on n).
inline float AttentionDot(const float* a, const float* b, int n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) part[j] += a[i] * b[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// exp(x) for the softmax weights (x <= 0 in every use): 0 for x <= -87 and for -inf, NaN
// stays NaN; otherwise 2^n p(r) with n = floor(x log2(e) + 1/2), r = x - n ln 2 in two steps
// (Cody-Waite) and the Cephes expf polynomial (about 1 ulp). Written as plain multiplies and
// adds in a fixed order so that vector lanes (chunk_attention_avx2.cc, ExpLanes) compute the
// same bits; the including files are built with -ffp-contract=off.
inline float ExpF(float x) {
  if (!(x > -87.0f)) return x != x ? x : 0.0f;
  x = std::min(x, 88.0f);
  const float fn = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r;
  p = p + 1.0f;
  return p * std::bit_cast<float>((static_cast<int>(fn) + 127) << 23);
}

// Online-softmax state of one query head.
struct SoftmaxState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0;
  float* acc = nullptr;  // [head_dim]
};

// Folds one chunk of entries (scores already scaled) into the state: one rescale per chunk.
inline void FoldChunk(SoftmaxState& st, const float* scores, const float* const* values,
                      int count, int head_dim) {
  float chunk_max = st.max;
  for (int j = 0; j < count; ++j) chunk_max = std::max(chunk_max, scores[j]);
  const float correction = ExpF(st.max - chunk_max);  // exp(-inf) = 0 on the first chunk
  st.sum *= correction;
  for (int d = 0; d < head_dim; ++d) st.acc[d] *= correction;
  for (int j = 0; j < count; ++j) {
    const float w = ExpF(scores[j] - chunk_max);
    st.sum += w;
    const float* v = values[j];
    for (int d = 0; d < head_dim; ++d) st.acc[d] += w * v[d];
  }
  st.max = chunk_max;
}

// out = acc / sum (zeros when nothing was folded).
inline void NormaliseState(const SoftmaxState& st, int head_dim, float* out) {
  const float inv = st.sum > 0 ? 1.0f / st.sum : 0.0f;
  for (int d = 0; d < head_dim; ++d) out[d] = st.acc[d] * inv;
}

}  // namespace morserve
