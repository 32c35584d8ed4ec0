// All tensors of a checkpoint directory by name, whatever the file format: safetensors
// (single or sharded with model.safetensors.index.json, mmap'd) or a PyTorch zip checkpoint
// (pytorch_model.bin, read once through libzip). The store owns the bytes; TensorViews
// point into it. Every malformed input is an error naming the tensor and the file.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/tensor_view.h"

namespace morserve {

class TensorStore {
 public:
  virtual ~TensorStore() = default;
  const TensorView* Find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Adds a tensor; error when the name already exists (named with both files).
  absl::Status Add(TensorView view);
  // Keeps `storage` alive as long as the store (mmaps, buffers).
  void Own(std::shared_ptr<void> storage) { storage_.push_back(std::move(storage)); }

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<void>> storage_;
};

// Opens the checkpoint files found in dir (safetensors preferred, then pytorch_model.bin).
absl::StatusOr<std::shared_ptr<TensorStore>> OpenCheckpointDir(const std::string& dir);

}  // namespace morserve
