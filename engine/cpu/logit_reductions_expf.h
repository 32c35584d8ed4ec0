// Cephes' single-precision expf as the scalar logit reductions compute it, one operation per
// line in the order the AVX2 set (logit_reductions_avx2.cc) issues its vector instructions,
// so the two agree bit for bit (include only from files compiled with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace morserve::expf_l8 {

inline constexpr float kLo = -87.33654f;  // about ln(FLT_MIN): below it the result is 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kC1 = 0.693359375f;  // ln 2 = kC1 + kC2 (kC1 exact in 9 bits)
inline constexpr float kC2 = -2.12194440e-4f;
inline constexpr float kP0 = 1.9875691500e-4f;
inline constexpr float kP1 = 1.3981999507e-3f;
inline constexpr float kP2 = 8.3334519073e-3f;
inline constexpr float kP3 = 4.1665795894e-2f;
inline constexpr float kP4 = 1.6666665459e-1f;
inline constexpr float kP5 = 5.0000001201e-1f;

// exp(d) for d <= 0 (larger d is outside its contract); NaN and d < kLo give 0.
inline float Exp(float d) {
  const bool keep = d >= kLo;
  const float x = d > kLo ? d : kLo;
  const float n = std::floor(x * kLog2e + 0.5f);
  float r = x - n * kC1;
  r = r - n * kC2;
  const float z = r * r;
  float y = kP0;
  y = y * r + kP1;
  y = y * r + kP2;
  y = y * r + kP3;
  y = y * r + kP4;
  y = y * r + kP5;
  y = y * z + r;
  y = y + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return keep ? y * scale : 0.0f;
}

}  // namespace morserve::expf_l8
