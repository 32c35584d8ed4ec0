// Element type names and conversions (see dtype.h).
#include "engine/model/dtype.h"

#include <cmath>

namespace morserve {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
  }
  return "?";
}

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24, round to nearest even
    const float q = a * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(q)));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.0f - 1.0f) * 1024.0f));
  uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  if (mant == 1024) { mant = 0; ++exp; }
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

void ToF32(DType t, const void* src, size_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, n * 4);  // an empty tensor's pointers may be null
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kI64: {
      const auto* s = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
  }
}

}  // namespace morserve
