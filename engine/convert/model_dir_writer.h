// Writes a converted model as a normal model directory: config.json (the source's Hugging
// Face config with the "recursion" object set), model.safetensors, and the tokenizer files
// of the source copied unchanged. Model files a previous run left in the directory
// (shards, index, pytorch_model.bin, recursion.json) are removed first so the loader cannot
// pick up a stale checkpoint. Before anything is written the tensors are resolved against
// the new config exactly as LoadModel will: a conversion the server would refuse is an
// error here (naming the tensor or field), not at serve time, and leaves no directory.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/io/safetensors_writer.h"
#include "engine/model/config.h"
#include "nlohmann/json.hpp"

namespace morserve {

// Tokenizer and generation files copied when present.
const std::vector<std::string>& TokenizerFileNames();

// `config` is the source config.json object; its "recursion" is replaced by `recursion`
// (removed when !recursion.present). `tokenizer_dir` may be empty (nothing copied).
absl::Status WriteModelDir(const std::string& out_dir, nlohmann::json config,
                           const RecursionConfig& recursion, const std::vector<OwnedTensor>& tensors,
                           const std::string& tokenizer_dir);

// The same with the recursion object given as JSON (already in config.json form).
absl::Status WriteModelDirJson(const std::string& out_dir, nlohmann::json config,
                               const nlohmann::json& recursion,
                               const std::vector<OwnedTensor>& tensors,
                               const std::string& tokenizer_dir);

}  // namespace morserve
