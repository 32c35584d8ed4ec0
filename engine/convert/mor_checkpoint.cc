// Official MoR checkpoint tensors -> loader names (see mor_checkpoint.h).
#include "engine/convert/mor_checkpoint.h"

#include <filesystem>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/safetensors.h"
#include "engine/io/torch_zip.h"

namespace morserve {

absl::StatusOr<std::shared_ptr<TensorStore>> OpenCheckpointPath(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return OpenCheckpointDir(path);
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--checkpoint ", path, ": no such file or directory"));
  }
  auto store = std::make_shared<TensorStore>();
  absl::Status s;
  if (absl::EndsWith(path, ".index.json")) {
    s = LoadShardedSafetensors(path, store.get());
  } else if (absl::EndsWith(path, ".safetensors")) {
    s = LoadSafetensorsFile(path, store.get());
  } else if (absl::EndsWith(path, ".bin") || absl::EndsWith(path, ".pt") ||
             absl::EndsWith(path, ".pth")) {
    s = LoadTorchZip(path, store.get());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint ", path,
        ": expected a directory, *.safetensors, *.index.json or a PyTorch zip (*.bin, *.pt)"));
  }
  if (!s.ok()) return s;
  return store;
}

std::string LoaderTensorName(const std::string& official) {
  if (absl::EndsWith(official, "rotary_emb.inv_freq")) return "";
  std::string name = official;
  for (bool again = true; again;) {
    again = false;
    for (const char* prefix : {"module.", "_orig_mod.", "base_model.model."}) {
      if (absl::StartsWith(name, prefix)) {
        name = name.substr(std::string(prefix).size());
        again = true;
      }
    }
  }
  return name;
}

absl::StatusOr<std::vector<OwnedTensor>> CopyMorTensors(const TensorStore& store) {
  std::vector<OwnedTensor> out;
  std::map<std::string, std::string> origin;  // loader name -> official name
  for (const auto& [name, view] : store.tensors()) {
    const std::string renamed = LoaderTensorName(name);
    if (renamed.empty()) continue;
    if (auto [it, fresh] = origin.emplace(renamed, name); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("tensors ", it->second, " and ", name, " in ",
                                                     view.file, " both map to ", renamed));
    }
    OwnedTensor t;
    t.name = renamed;
    t.dtype = view.dtype;
    t.shape = view.shape;
    const auto* p = static_cast<const uint8_t*>(view.data);
    t.bytes.assign(p, p + view.nbytes());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace morserve
