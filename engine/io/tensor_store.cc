// TensorStore and checkpoint directory discovery (see tensor_store.h).
#include "engine/io/tensor_store.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/io/safetensors.h"
#include "engine/io/torch_zip.h"

namespace morserve {

const TensorView* TensorStore::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status TensorStore::Add(TensorView view) {
  const auto it = tensors_.find(view.name);
  if (it != tensors_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", view.name, "' appears twice: in ",
                                                   it->second.file, " and in ", view.file));
  }
  std::string name = view.name;
  tensors_.emplace(std::move(name), std::move(view));
  return absl::OkStatus();
}

namespace {

bool Exists(const std::filesystem::path& path) {
  std::error_code ec;  // the throwing overload would escape on permission errors
  return std::filesystem::exists(path, ec);
}

}  // namespace

absl::StatusOr<std::shared_ptr<TensorStore>> OpenCheckpointDir(const std::string& dir) {
  const std::filesystem::path root(dir);
  auto store = std::make_shared<TensorStore>();
  absl::Status status;
  if (Exists(root / "model.safetensors")) {
    status = LoadSafetensorsFile((root / "model.safetensors").string(), store.get());
  } else if (Exists(root / "model.safetensors.index.json")) {
    status = LoadShardedSafetensors((root / "model.safetensors.index.json").string(), store.get());
  } else if (Exists(root / "pytorch_model.bin")) {
    status = LoadTorchZip((root / "pytorch_model.bin").string(), store.get());
  } else {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint in ", dir,
        ": expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"));
  }
  if (!status.ok()) return status;
  return store;
}

}  // namespace morserve
