// PyTorch zip checkpoints (torch.save since 1.6, e.g. pytorch_model.bin): a zip holding
// <top>/data.pkl (the pickled state dict) and <top>/data/<key> (raw little-endian storages);
// the top directory name varies. Each referenced storage is read once, through libzip, into
// an owned buffer; TensorViews point into those buffers. Only contiguous bf16, f16 and f32
// tensors are accepted.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/io/tensor_store.h"
#include "engine/model/dtype.h"

namespace morserve {

// One entry of the state dict, checked against nothing but the pickle itself.
struct TorchTensorRecord {
  std::string name;
  std::string storage_key;   // data/<storage_key> in the archive
  std::string storage_type;  // "torch.BFloat16Storage"
  int64_t storage_numel = 0;
  int64_t storage_offset = 0;  // in elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

// Reads the state dict (a dict of name -> tensor) pickled in `pickle`; `file` names errors.
absl::StatusOr<std::vector<TorchTensorRecord>> ReadTorchStateDict(std::string_view pickle,
                                                                  const std::string& file);

// The element type of a storage class, or an error naming the tensor and the file.
absl::StatusOr<DType> TorchStorageDType(const TorchTensorRecord& record, const std::string& file);

// Checks shape, contiguity and bounds of `record` within its storage; `file` names errors.
absl::Status CheckTorchTensor(const TorchTensorRecord& record, const std::string& file);

// Loads every tensor of the checkpoint at `path` into `store`.
absl::Status LoadTorchZip(const std::string& path, TensorStore* store);

}  // namespace morserve
