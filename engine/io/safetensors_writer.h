// Writes a safetensors file (8-byte little-endian header length, JSON header, data).
// Used by `morserve mkmodel`, `morserve convert` and tests that build checkpoints.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/dtype.h"

namespace morserve {

struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel * DTypeSize(dtype)

  // Stores fp32 values converted to dtype (bf16: round to nearest even).
  static OwnedTensor FromF32(std::string name, DType dtype, std::vector<int64_t> shape,
                             const std::vector<float>& values);
};

// Writes tensors in the given order; offsets are contiguous, header padded to 8 bytes.
absl::Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace morserve
