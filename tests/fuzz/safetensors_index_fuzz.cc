// Fuzzes the sharded-checkpoint loader (engine/io/safetensors.cc, LoadShardedSafetensors) on
// arbitrary model.safetensors.index.json text, beside two real shards written once into the
// scratch directory: weight_map entries naming missing files, paths that leave the directory,
// tensors in the wrong shard or absent. Property: what loads lies inside the shards.
#include <filesystem>
#include <mutex>

#include "engine/io/safetensors.h"
#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// Shards: model-00001-of-00002.safetensors (a, b), model-00002-of-00002.safetensors (c).
void WriteShards(const std::string& dir) {
  using morserve::DType;
  using morserve::OwnedTensor;
  auto t = [](const char* name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return OwnedTensor::FromF32(name, DType::kBF16, shape, std::vector<float>(n, 0.5f));
  };
  morserve::fuzz::Check(
      morserve::WriteSafetensors(dir + "/model-00001-of-00002.safetensors",
                                 {t("a", {2, 3}), t("b", {4})})
          .ok(),
      "writing shard 1");
  morserve::fuzz::Check(
      morserve::WriteSafetensors(dir + "/model-00002-of-00002.safetensors", {t("c", {3, 2})})
          .ok(),
      "writing shard 2");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  static const std::string dir = [] {
    std::string d = fuzz::ScratchDir() + "/sharded";
    std::filesystem::create_directories(d);
    WriteShards(d);
    return d;
  }();
  const std::string index = dir + "/model.safetensors.index.json";
  fuzz::WriteFile(index, fuzz::AsText(data, size));
  TensorStore store;
  absl::Status s = LoadShardedSafetensors(index, &store);
  if (!s.ok()) {
    fuzz::Check(!s.message().empty(), "an error says what is wrong");
    return 0;
  }
  for (const auto& [name, v] : store.tensors()) {
    fuzz::Check(name == "a" || name == "b" || name == "c", "only the shards' tensors load");
    fuzz::TouchBytes(v.data, v.nbytes());
  }
  return 0;
}
