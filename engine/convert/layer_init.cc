// Initialisation sources of shared layers (see layer_init.h).
#include "engine/convert/layer_init.h"

#include "absl/strings/str_cat.h"

namespace morserve {

absl::StatusOr<InitStrategy> ParseInitStrategy(const std::string& name) {
  if (name == "stepwise") return InitStrategy::kStepwise;
  if (name == "average") return InitStrategy::kAverage;
  if (name == "lower") return InitStrategy::kLower;
  return absl::InvalidArgumentError(
      absl::StrCat("--init: must be stepwise, average or lower, got '", name, "'"));
}

const char* InitStrategyName(InitStrategy s) {
  switch (s) {
    case InitStrategy::kStepwise:
      return "stepwise";
    case InitStrategy::kAverage:
      return "average";
    case InitStrategy::kLower:
      return "lower";
  }
  return "?";
}

std::vector<int> InitSourceLayers(const LayerPlan& plan, InitStrategy strategy, int segment,
                                  int k) {
  const Segment& seg = plan.segments[segment];
  if (!seg.looped()) return {plan.UnrolledLayer(segment, 0, k)};
  if (strategy == InitStrategy::kAverage) {
    std::vector<int> layers;
    for (int loop = 0; loop < seg.loops; ++loop) layers.push_back(plan.UnrolledLayer(segment, loop, k));
    return layers;
  }
  // Position i of the shared block in plan order, and the first looped original layer.
  int position = 0, lo = -1;
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    if (!plan.segments[s].looped()) continue;
    if (lo < 0) lo = plan.UnrolledLayer(s, 0, 0);
    if (s == segment) break;
    position += plan.segments[s].num_layers;
  }
  position += k;
  const int stride = strategy == InitStrategy::kStepwise ? seg.loops : 1;
  return {lo + position * stride};
}

}  // namespace morserve
