// `morserve convert` from directory to directory: the two conversions the CLI offers, each
// reading its sources, building the tensors (recursive_converter.h, mor_checkpoint.h) and
// writing a normal model directory (model_dir_writer.h).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/convert/recursive_converter.h"

namespace morserve {

// Vanilla Hugging Face Llama directory -> Recursive (or Relaxed) model directory.
absl::Status ConvertVanillaDir(const std::string& from_dir, const std::string& out_dir,
                               const RecursiveConversionOptions& options);

// Official MoR run (its Hydra YAML and checkpoint dir or file) -> model directory.
// `config_path` (the HF config.json) may be empty: it is then looked up in the checkpoint
// directory, or beside the checkpoint file. Tokenizer files come from that same directory.
absl::Status ConvertMorRun(const std::string& yaml_path, const std::string& checkpoint,
                           const std::string& config_path, const std::string& out_dir);

}  // namespace morserve
