// Element types found in checkpoints, and scalar conversions to fp32.
// bf16 and f16 are stored as raw uint16 bit patterns; conversion is exact to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace morserve {

enum class DType { kF32, kF16, kBF16, kI64, kI32 };

size_t DTypeSize(DType t);
std::string_view DTypeName(DType t);  // "F32", "F16", "BF16", "I64", "I32" (safetensors names)
std::optional<DType> DTypeFromSafetensors(std::string_view name);

inline float Bf16ToF32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as PyTorch does.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

// Converts n elements of type t at src to fp32.
void ToF32(DType t, const void* src, size_t n, float* dst);

}  // namespace morserve
