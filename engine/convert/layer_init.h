// Which original layers initialise each shared layer when a vanilla model becomes a Recursive
// one (Relaxed Recursive Transformers, Bae et al. 2024, section 3.1). Let L be the vanilla
// depth, Nr the recursion count and K = (looped layers) / Nr the depth of the shared block;
// the looped layers are 0..L-1 (cycle, sequence) or 1..L-2 (middle_*), the first of them
// `lo`. Shared position i (i = 0..K-1, plan order: cycle's block layers, or sequence's
// one-layer segments) takes:
//   - stepwise: original layer lo + i*Nr, every Nr-th layer from the first looped one (the
//     paper: "selecting intermediate layers at specific intervals", its example for 6 layers
//     and 3 recursions keeps layers 1 and 4). The released MoR/RRT code instead rounds
//     linspace(lo, hi, K), which also keeps the last layer; we follow the paper.
//   - lower: original layer lo + i, the lowest K looped layers.
//   - average: the element-wise mean of the Nr original layers that run on position i after
//     conversion (cycle: lo + i + r*K; sequence: lo + i*Nr + r).
// Unique layers (middle_* first and last) keep their own weights. Norm weights follow the
// same rule as the projections.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/layer_plan.h"

namespace morserve {

enum class InitStrategy { kStepwise, kAverage, kLower };

absl::StatusOr<InitStrategy> ParseInitStrategy(const std::string& name);  // errors name --init
const char* InitStrategyName(InitStrategy s);

// Original (vanilla, unrolled) layers whose weights initialise layer (segment, k) of `plan`:
// one layer for unique layers, stepwise and lower; Nr layers for average.
std::vector<int> InitSourceLayers(const LayerPlan& plan, InitStrategy strategy, int segment,
                                  int k);

}  // namespace morserve
