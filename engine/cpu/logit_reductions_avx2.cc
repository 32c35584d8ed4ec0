// The AVX2 logit reductions: logit_reductions.h's 8 lanes are one __m256 (two __m256d for the
// double sums of exp), the expf of logit_reductions_expf.h one instruction per line of it, so
// the results equal the scalar set's bit for bit. Compiled for AVX2 without FMA and with
// -ffp-contract=off.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/cpu/logit_reductions.h"
#include "engine/cpu/logit_reductions_expf.h"
#include "engine/cpu/simd_target.h"

MORSERVE_BEGIN_TARGET("avx2")

namespace morserve {
namespace {

constexpr int kLanes = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Entries [b, n) of the last block, padded with -inf.
__m256 LoadTail(const float* x, int64_t b, int64_t n) {
  alignas(32) float t[kLanes];
  for (int l = 0; l < kLanes; ++l) t[l] = b + l < n ? x[b + l] : kNegInf;
  return _mm256_load_ps(t);
}

float Avx2Max(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(kNegInf);
  int64_t b = 0;
  for (; b + kLanes <= n; b += kLanes) m = _mm256_max_ps(_mm256_loadu_ps(x + b), m);
  if (b < n) m = _mm256_max_ps(LoadTail(x, b, n), m);
  alignas(32) float l[kLanes];
  _mm256_store_ps(l, m);
  auto mx = [](float a, float c) { return a > c ? a : c; };
  return mx(mx(mx(l[0], l[4]), mx(l[2], l[6])), mx(mx(l[1], l[5]), mx(l[3], l[7])));
}

int64_t Avx2Find(const float* x, int64_t n, float v) {
  const __m256 vv = _mm256_set1_ps(v);
  int64_t b = 0;
  for (; b + kLanes <= n; b += kLanes) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + b), vv, _CMP_EQ_OQ));
    if (hit != 0) return b + __builtin_ctz(hit);
  }
  for (; b < n; ++b) {
    if (x[b] == v) return b;
  }
  return n;
}

// expf_l8::Exp on 8 lanes.
inline __attribute__((always_inline)) __m256 Exp8(__m256 d) {
  using namespace expf_l8;
  const __m256 lo = _mm256_set1_ps(kLo);
  const __m256 keep = _mm256_cmp_ps(d, lo, _CMP_GE_OQ);
  const __m256 x = _mm256_max_ps(d, lo);
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kC1)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kC2)));
  const __m256 z = _mm256_mul_ps(r, r);
  __m256 y = _mm256_set1_ps(kP0);
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(kP1));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(kP2));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(kP3));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(kP4));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(kP5));
  y = _mm256_add_ps(_mm256_mul_ps(y, z), r);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

double Avx2SumExp(const float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256d lo4 = _mm256_setzero_pd();  // lanes 0-3
  __m256d hi4 = _mm256_setzero_pd();  // lanes 4-7
  __m256 nan = _mm256_setzero_ps();
  auto block = [&](__m256 v) {
    const __m256 d = _mm256_sub_ps(v, mv);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(d, d, _CMP_UNORD_Q));
    const __m256 e = Exp8(d);
    lo4 = _mm256_add_pd(lo4, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi4 = _mm256_add_pd(hi4, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  int64_t b = 0;
  // Four blocks' exps in flight at once (the chain of one is ~80 cycles long), added to the
  // lanes in block order: the same sums as one block at a time.
  for (; b + 4 * kLanes <= n; b += 4 * kLanes) {
    __m256 d[4], e[4];
    for (int j = 0; j < 4; ++j) {
      d[j] = _mm256_sub_ps(_mm256_loadu_ps(x + b + j * kLanes), mv);
      e[j] = Exp8(d[j]);
    }
    for (int j = 0; j < 4; ++j) {
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(d[j], d[j], _CMP_UNORD_Q));
      lo4 = _mm256_add_pd(lo4, _mm256_cvtps_pd(_mm256_castps256_ps128(e[j])));
      hi4 = _mm256_add_pd(hi4, _mm256_cvtps_pd(_mm256_extractf128_ps(e[j], 1)));
    }
  }
  for (; b + kLanes <= n; b += kLanes) block(_mm256_loadu_ps(x + b));
  if (b < n) block(LoadTail(x, b, n));
  if (_mm256_movemask_ps(nan) != 0) return std::numeric_limits<double>::quiet_NaN();
  alignas(32) double l[kLanes];
  _mm256_store_pd(l, lo4);
  _mm256_store_pd(l + 4, hi4);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

}  // namespace

const LogitReductionSet* Avx2LogitReductions() {
  static const bool ok = __builtin_cpu_supports("avx2");
  static const LogitReductionSet set{"avx2", &Avx2Max, &Avx2Find, &Avx2SumExp};
  return ok ? &set : nullptr;
}

}  // namespace morserve

MORSERVE_END_TARGET
