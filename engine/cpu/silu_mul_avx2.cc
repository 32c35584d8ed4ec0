// SwiGLU's activation, 4 lanes of double per AVX2 vector: ExpDouble's operations (silu_mul.h)
// lane by lane in the same order, so the bits are the scalar build's. Compiled with
// -ffp-contract=off (the FMAs are the written intrinsics).
#include <immintrin.h>

#include <cmath>

#include "engine/cpu/silu_mul.h"
#include "engine/cpu/simd_target.h"

namespace morserve {

MORSERVE_BEGIN_TARGET("avx2,fma")

namespace {

__m256d ExpLanes(__m256d x) {
  using namespace silu_exp;
  // max/min return their second operand when either is NaN: NaN lanes stay NaN throughout.
  x = _mm256_min_pd(_mm256_set1_pd(kMax), _mm256_max_pd(_mm256_set1_pd(kMin), x));
  const __m256d shifter = _mm256_set1_pd(kShifter);
  const __m256d t = _mm256_fmadd_pd(x, _mm256_set1_pd(kLog2e), shifter);
  const __m256d n = _mm256_sub_pd(t, shifter);
  __m256d r = _mm256_fmadd_pd(n, _mm256_set1_pd(-kLn2Hi), x);
  r = _mm256_fmadd_pd(n, _mm256_set1_pd(-kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kInvFact[13]);
  for (int i = 12; i >= 0; --i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kInvFact[i]));
  // t's low bits hold n (|n| < 2^51): 2^n's bits are (n + 1023) << 52.
  const __m256i n_int = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(shifter));
  const __m256i scale = _mm256_slli_epi64(_mm256_add_epi64(n_int, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(scale));
}

// 4 elements (count < 4: the first count, the rest neither read nor written).
void SiluMul4(const float* gate, const float* up, float* out, int count) {
  const __m128i m = _mm_cmpgt_epi32(_mm_set1_epi32(count), _mm_setr_epi32(0, 1, 2, 3));
  const __m256d g = _mm256_cvtps_pd(_mm_maskload_ps(gate, m));
  const __m256d u = _mm256_cvtps_pd(_mm_maskload_ps(up, m));
  const __m256d e = ExpLanes(_mm256_xor_pd(g, _mm256_set1_pd(-0.0)));  // -g, as the scalar build
  __m256d s = _mm256_div_pd(g, _mm256_add_pd(_mm256_set1_pd(1.0), e));
  const __m256d minus_inf = _mm256_cmp_pd(g, _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ);
  s = _mm256_blendv_pd(s, _mm256_set1_pd(std::nan("")), minus_inf);  // as the scalar build
  _mm_maskstore_ps(out, m, _mm256_cvtpd_ps(_mm256_mul_pd(s, u)));
}

void SiluMulAvx2Impl(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) SiluMul4(gate + i, up + i, out + i, 4);
  if (i < count) SiluMul4(gate + i, up + i, out + i, static_cast<int>(count - i));
}

}  // namespace

MORSERVE_END_TARGET

SiluMulFn SiluMulAvx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok ? &SiluMulAvx2Impl : nullptr;
}

}  // namespace morserve
