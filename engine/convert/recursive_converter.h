// Vanilla Llama -> Recursive or Relaxed Recursive Transformer (Bae et al. 2024), as tensors.
//
// Strict (lora_rank 0): each shared position is initialised from the original layers that
// layer_init.h names, and only loop 0's copy is stored (model.layers.{j} for the unrolled
// layers j of loop 0); the loader ties the missing copies to it.
//
// Relaxed (lora_rank R > 0): every loop's copy is stored, since the loader wants each copy
// of a Relaxed layer. A targeted projection of loop r is stored PEFT-style: base_layer.weight
// is the shared weight and lora_A/lora_B the truncated SVD of W_original(j) - W_shared
// (lora_svd.h), j being the unrolled layer loop r runs; other projections store the shared
// weight (equal copies, deduplicated on load). RMSNorm weights are kept per loop (the
// originals, 2H values per layer) by default in Relaxed models: LoRA cannot express a
// difference in norm weights, and with them per loop a full-rank conversion computes the
// original model. `norms = kShared` ties them as the strict model does.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/convert/layer_init.h"
#include "engine/io/safetensors_writer.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace morserve {

enum class NormTying { kAuto, kShared, kPerLoop };  // auto: shared when strict, per loop relaxed

struct RecursiveConversionOptions {
  Sharing sharing = Sharing::kCycle;
  int recursions = 2;
  InitStrategy init = InitStrategy::kStepwise;
  int lora_rank = 0;
  float lora_alpha = 0.0f;                // 0: alpha = rank (scale 1)
  std::vector<std::string> lora_targets;  // empty: all seven projections
  NormTying norms = NormTying::kAuto;
};

struct ConvertedModel {
  ModelConfig config;                // the source config with the new recursion object
  std::vector<OwnedTensor> tensors;  // in file order
};

// `source` must be a vanilla model (no recursion object). Errors name the flag at fault
// (--sharing, --recursions, --lora-rank, --lora-alpha, --lora-targets).
absl::StatusOr<ConvertedModel> ConvertVanillaToRecursive(const ModelWeights& source,
                                                         const RecursiveConversionOptions& options);

}  // namespace morserve
