// safetensors reader: one file, or a sharded checkpoint through model.safetensors.index.json.
// Files are mmap'd; TensorViews point into the mapping, which the TensorStore owns. Every
// header field is checked against the file before a view is made, so no byte outside the
// data region is ever read, whatever the file holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/io/tensor_store.h"
#include "engine/model/tensor_view.h"

namespace morserve {

// Parses the safetensors bytes [bytes, bytes + size); `file` names them in views and errors.
// Views are in header order (`__metadata__` is skipped).
absl::StatusOr<std::vector<TensorView>> ParseSafetensors(const uint8_t* bytes, size_t size,
                                                         const std::string& file);

// Maps `path` and adds its tensors to `store` (which then owns the mapping).
absl::Status LoadSafetensorsFile(const std::string& path, TensorStore* store);

// Loads every shard named by the index at `index_path` (shards live beside it). Every
// tensor in the index must be found in the shard it names, and every tensor of a shard
// must be listed in the index for that shard.
absl::Status LoadShardedSafetensors(const std::string& index_path, TensorStore* store);

}  // namespace morserve
