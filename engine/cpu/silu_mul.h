// SwiGLU's activation on the CPU: out = float(silu(g) * u), silu(g) = g / (1 + e^-g), in double
// and rounded once (as engine/reference writes it). e^x is ExpDouble below, a fixed sequence of
// double operations rather than libm's exp, so that the scalar build and the AVX2 (4 lanes) and
// AVX-512 (8 lanes) builds give the same bits by construction; it is within 1 ulp of the correctly
// rounded e^x, so SiluMulRows rounds to the reference's float except where the double result lies
// within an ulp or two of a float rounding boundary (none in the tests' 2^22 samples:
// silu_mul_test).
//
// ExpDouble: n = nearest(x / ln 2) (a shifter add), r = x - n ln 2 in two FMAs (Cody-Waite,
// fdlibm's split of ln 2), e^r by its Taylor series to r^13 / 13! in Horner form (|r| <= 0.347:
// truncation under 0.05 ulp), times 2^n built in the exponent bits. x is clamped to
// [-708, 700] first: outside it silu(g) rounds to the same float either way (1 + e^-708 is 1;
// g / (1 + e^700) * u is a float zero of the same sign as g / (1 + e^-g) * u); g = -inf gives
// NaN, as the reference's -inf / (1 + e^inf) does.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace morserve {

namespace silu_exp {
inline constexpr double kMin = -708.0;
inline constexpr double kMax = 700.0;
inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kShifter = 0x1.8p52;  // t = x / ln2 + this: n in t's low bits
inline constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm ln2_hi (32 bits)
inline constexpr double kLn2Lo = 1.90821492927058770002e-10;  // fdlibm ln2_lo
// 1 / i! for i = 0..13.
inline constexpr double kInvFact[14] = {1.0,
                                        1.0,
                                        1.0 / 2,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600,
                                        1.0 / 6227020800.0};
}  // namespace silu_exp

// e^x for x in [-708, 700], clamped outside; NaN stays NaN. See above.
inline double ExpDouble(double x) {
  using namespace silu_exp;
  if (std::isnan(x)) return x;
  x = std::min(kMax, std::max(kMin, x));
  const double t = std::fma(x, kLog2e, kShifter);
  const double n = t - kShifter;
  double r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  double p = kInvFact[13];
  for (int i = 12; i >= 0; --i) p = std::fma(p, r, kInvFact[i]);
  const uint64_t scale = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  return p * std::bit_cast<double>(scale);
}

// out[r, i] = float(silu(gate[r, i]) * up[r, i]) with ExpDouble. out may equal gate or up.
// Picks the widest build the host runs (MORSERVE_CPU_KERNELS=scalar or avx2 pins that build).
void SiluMulRows(const float* gate, const float* up, int rows, int n, float* out);
// The builds, for the tests: the scalar one (the path of hosts without AVX2), the AVX2 one (nullptr
// without AVX2/FMA) and the AVX-512 one (nullptr without AVX-512 F/DQ/VL).
void SiluMulScalar(const float* gate, const float* up, int64_t count, float* out);
using SiluMulFn = void (*)(const float* gate, const float* up, int64_t count, float* out);
SiluMulFn SiluMulAvx2();
SiluMulFn SiluMulAvx512();

}  // namespace morserve
