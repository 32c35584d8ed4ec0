// Model directory output of `morserve convert` (see model_dir_writer.h).
#include "engine/convert/model_dir_writer.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/io/tensor_store.h"
#include "engine/model/layer_plan.h"
#include "engine/model/weights.h"

namespace morserve {
namespace {

namespace fs = std::filesystem;

bool IsModelFile(const std::string& name) {
  return name == "recursion.json" || name == "pytorch_model.bin" ||
         name == "model.safetensors.index.json" ||
         (name.rfind("model", 0) == 0 && name.ends_with(".safetensors"));
}

// Resolves the tensors against the config exactly as LoadModel will, from memory.
absl::Status Validate(const nlohmann::json& config, const std::vector<OwnedTensor>& tensors) {
  auto parsed = ParseModelConfig(config, nullptr);
  if (!parsed.ok()) return parsed.status();
  auto plan = BuildLayerPlan(*parsed);
  if (!plan.ok()) return plan.status();
  auto store = std::make_shared<TensorStore>();
  for (const OwnedTensor& t : tensors) {
    TensorView v;
    v.name = t.name;
    v.file = "model.safetensors";
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = t.bytes.data();
    if (auto s = store->Add(std::move(v)); !s.ok()) return s;
  }
  return ResolveWeights(*parsed, *plan, store).status();
}

absl::Status PrepareDir(const std::string& out_dir, const std::string& tokenizer_dir) {
  std::error_code ec;
  if (!tokenizer_dir.empty() && fs::exists(out_dir, ec) &&
      fs::equivalent(out_dir, tokenizer_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out ", out_dir, " is the source directory; write to a new directory"));
  }
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    if (IsModelFile(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& TokenizerFileNames() {
  static const std::vector<std::string> names = {
      "tokenizer.json",     "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
      "added_tokens.json",  "vocab.json",            "merges.txt",      "generation_config.json",
      "chat_template.jinja", "chat_template.json"};
  return names;
}

absl::Status WriteModelDirJson(const std::string& out_dir, nlohmann::json config,
                               const nlohmann::json& recursion,
                               const std::vector<OwnedTensor>& tensors,
                               const std::string& tokenizer_dir) {
  config.erase("recursion");
  if (!recursion.is_null()) config["recursion"] = recursion;
  if (auto s = Validate(config, tensors); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the converted model would not load: ", s.message()));
  }
  if (auto s = PrepareDir(out_dir, tokenizer_dir); !s.ok()) return s;
  {
    std::ofstream out(out_dir + "/config.json", std::ios::binary | std::ios::trunc);
    out << config.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", out_dir, "/config.json"));
  }
  if (auto s = WriteSafetensors(out_dir + "/model.safetensors", tensors, {{"format", "pt"}});
      !s.ok()) {
    return s;
  }
  for (const std::string& name : TokenizerFileNames()) {
    if (tokenizer_dir.empty()) break;
    const fs::path from = fs::path(tokenizer_dir) / name;
    std::error_code ec;
    if (!fs::exists(from, ec)) continue;
    fs::copy_file(from, fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", from.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteModelDir(const std::string& out_dir, nlohmann::json config,
                           const RecursionConfig& recursion, const std::vector<OwnedTensor>& tensors,
                           const std::string& tokenizer_dir) {
  return WriteModelDirJson(out_dir, std::move(config),
                           recursion.present ? RecursionToJson(recursion) : nlohmann::json(),
                           tensors, tokenizer_dir);
}

}  // namespace morserve
