// Tensors of an official MoR training checkpoint, renamed for the loader. The official
// layouts (docs/checkpoints.md#tensor-layouts: model.layers.{r}.block.{k}.*, block_list,
// mor_router, mlp_router, router_bias) are already what ResolveWeights reads, so conversion
// is a copy of the bytes (dtype unchanged) with the wrappers training adds stripped from the
// names:
// `module.` (DeepSpeed / DDP), `_orig_mod.` (torch.compile) and `base_model.model.` (PEFT).
// RoPE inv_freq buffers are dropped. Two names that become one are an error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"

namespace morserve {

// A checkpoint directory (as OpenCheckpointDir) or one file: *.safetensors,
// model.safetensors.index.json, or a PyTorch zip (*.bin, *.pt, *.pth).
absl::StatusOr<std::shared_ptr<TensorStore>> OpenCheckpointPath(const std::string& path);

// The loader's name for an official state-dict key ("" for buffers that are dropped).
std::string LoaderTensorName(const std::string& official);

absl::StatusOr<std::vector<OwnedTensor>> CopyMorTensors(const TensorStore& store);

}  // namespace morserve
