// SwiGLU's activation, 8 lanes of double per AVX-512 vector: ExpDouble's operations (silu_mul.h)
// lane by lane in the same order, so the bits are the scalar build's. Compiled with
// -ffp-contract=off (the FMAs are the written intrinsics).
#include <cmath>

#include "engine/cpu/silu_mul.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {

MORSERVE_BEGIN_TARGET("avx512f,avx512dq,avx512vl")

namespace {

__m512d ExpLanes(__m512d x) {
  using namespace silu_exp;
  // max/min return their second operand when either is NaN: NaN lanes stay NaN throughout.
  x = _mm512_min_pd(_mm512_set1_pd(kMax), _mm512_max_pd(_mm512_set1_pd(kMin), x));
  const __m512d shifter = _mm512_set1_pd(kShifter);
  const __m512d t = _mm512_fmadd_pd(x, _mm512_set1_pd(kLog2e), shifter);
  const __m512d n = _mm512_sub_pd(t, shifter);
  __m512d r = _mm512_fmadd_pd(n, _mm512_set1_pd(-kLn2Hi), x);
  r = _mm512_fmadd_pd(n, _mm512_set1_pd(-kLn2Lo), r);
  __m512d p = _mm512_set1_pd(kInvFact[13]);
  for (int i = 12; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[i]));
  // t's low bits hold n (|n| < 2^51): 2^n's bits are (n + 1023) << 52.
  const __m512i n_int = _mm512_sub_epi64(_mm512_castpd_si512(t), _mm512_castpd_si512(shifter));
  const __m512i scale = _mm512_slli_epi64(_mm512_add_epi64(n_int, _mm512_set1_epi64(1023)), 52);
  return _mm512_mul_pd(p, _mm512_castsi512_pd(scale));
}

// 8 elements (count < 8: the first count, the rest neither read nor written).
void SiluMul8(const float* gate, const float* up, float* out, int count) {
  const __mmask8 m = static_cast<__mmask8>((1u << count) - 1u);
  const __m512d g = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, gate));
  const __m512d u = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, up));
  const __m512d e = ExpLanes(_mm512_xor_pd(g, _mm512_set1_pd(-0.0)));  // -g, as the scalar build
  __m512d s = _mm512_div_pd(g, _mm512_add_pd(_mm512_set1_pd(1.0), e));
  const __mmask8 minus_inf = _mm512_cmp_pd_mask(g, _mm512_set1_pd(-INFINITY), _CMP_EQ_OQ);
  s = _mm512_mask_mov_pd(s, minus_inf, _mm512_set1_pd(std::nan("")));  // as the scalar build
  _mm256_mask_storeu_ps(out, m, _mm512_cvtpd_ps(_mm512_mul_pd(s, u)));
}

void SiluMulAvx512Impl(const float* gate, const float* up, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) SiluMul8(gate + i, up + i, out + i, 8);
  if (i < count) SiluMul8(gate + i, up + i, out + i, static_cast<int>(count - i));
}

}  // namespace

MORSERVE_END_TARGET

SiluMulFn SiluMulAvx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vl");
  return ok ? &SiluMulAvx512Impl : nullptr;
}

}  // namespace morserve
