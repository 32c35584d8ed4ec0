// safetensors writer (see safetensors_writer.h).
#include "engine/io/safetensors_writer.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve {

OwnedTensor OwnedTensor::FromF32(std::string name, DType dtype, std::vector<int64_t> shape,
                                 const std::vector<float>& values) {
  OwnedTensor t{std::move(name), dtype, std::move(shape), {}};
  t.bytes.resize(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32: std::memcpy(&t.bytes[i * 4], &values[i], 4); break;
      case DType::kBF16: {
        uint16_t b = F32ToBf16(values[i]);
        std::memcpy(&t.bytes[i * 2], &b, 2);
        break;
      }
      case DType::kF16: {
        uint16_t h = F32ToF16(values[i]);
        std::memcpy(&t.bytes[i * 2], &h, 2);
        break;
      }
      case DType::kI64: {
        int64_t v = static_cast<int64_t>(values[i]);
        std::memcpy(&t.bytes[i * 8], &v, 8);
        break;
      }
      case DType::kI32: {
        int32_t v = static_cast<int32_t>(values[i]);
        std::memcpy(&t.bytes[i * 4], &v, 4);
        break;
      }
    }
  }
  return t;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const OwnedTensor& t : tensors) {
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const OwnedTensor& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  }
  if (!out) return absl::InternalError(absl::StrCat("write failed: ", path));
  return absl::OkStatus();
}

}  // namespace morserve
