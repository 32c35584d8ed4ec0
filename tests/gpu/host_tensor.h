// Kernel test data that a kernel reads as fp32 or bf16: the fp32 values the CPU references use
// (rounded to bf16 first where the kernel reads bf16) beside the bytes to hand the kernel, and
// the reading back of an fp32-or-bf16 output. Shared by the GPU tests and their CPU-emulator
// twins, which differ only in where the bytes go (device memory, or the emulated kernel).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"

namespace morserve::testing {

// Bytes of one element of a kernel tensor: 2 for bf16, 4 for fp32.
inline size_t KernelDTypeBytes(DType t) { return t == DType::kBF16 ? 2 : 4; }
inline std::string KernelDTypeName(DType t) { return t == DType::kBF16 ? "bf16" : "f32"; }

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<float> values;   // what the reference reads
  std::vector<uint16_t> bits;  // bf16 only: what the kernel reads

  // `values` as the kernel of dtype t will see them (bf16: rounded to nearest even).
  static HostTensor Of(DType t, std::vector<float> values) {
    HostTensor h;
    h.dtype = t;
    h.values = std::move(values);
    if (t == DType::kBF16) {
      h.bits.reserve(h.values.size());
      for (float& v : h.values) {
        h.bits.push_back(F32ToBf16(v));
        v = Bf16ToF32(h.bits.back());
      }
    }
    return h;
  }
  const void* data() const {
    return dtype == DType::kBF16 ? static_cast<const void*>(bits.data())
                                 : static_cast<const void*>(values.data());
  }
  size_t bytes() const { return values.size() * KernelDTypeBytes(dtype); }
};

// Element i of an output of dtype t held as raw bytes (as downloaded, or as the emulated kernel
// wrote it), widened to fp32.
inline float ReadKernelOutput(DType t, const std::vector<uint8_t>& raw, size_t i) {
  if (t == DType::kBF16) {
    uint16_t b;
    std::memcpy(&b, raw.data() + 2 * i, 2);
    return Bf16ToF32(b);
  }
  float f;
  std::memcpy(&f, raw.data() + 4 * i, 4);
  return f;
}

}  // namespace morserve::testing
