// Layer plans for every sharing strategy (see layer_plan.h and
// docs/models.md#layer-plan-and-sharing).
#include "engine/model/layer_plan.h"

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

absl::Status PlanError(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

void AddSegment(LayerPlan* plan, int num_layers, int loops) {
  Segment s;
  s.first_layer_slot = plan->num_layer_slots;
  s.num_layers = num_layers;
  s.loops = loops;
  s.first_cache_slot = plan->num_cache_slots;
  plan->num_layer_slots += num_layers;
  const bool shared = plan->kv == KvMode::kShared && loops > 1;
  plan->num_cache_slots += num_layers * (shared ? 1 : loops);
  plan->segments.push_back(s);
}

}  // namespace

absl::StatusOr<LayerPlan> BuildLayerPlan(const ModelConfig& config) {
  const RecursionConfig& r = config.recursion;
  const int n = config.num_layers;
  const int nr = r.num_recursions;
  LayerPlan plan;
  plan.kv = r.kv;
  plan.sharing = r.sharing;
  const bool middle = r.sharing == Sharing::kMiddleCycle || r.sharing == Sharing::kMiddleSequence;
  const int first = middle ? r.middle_first : 0, last = middle ? r.middle_last : 0;
  const int looped_layers = n - first - last;
  if (middle && looped_layers < 1) {
    return PlanError("recursion.sharing",
                     absl::StrCat(SharingName(r.sharing),
                                  " needs num_hidden_layers >= ", first + last + 1, ", got ", n));
  }
  if (looped_layers % nr != 0) {
    return PlanError("recursion.num_recursions",
                     absl::StrCat(nr, " does not divide the ", looped_layers, " layers that ",
                                  SharingName(r.sharing), " shares (num_hidden_layers ", n, ")"));
  }
  const int k = looped_layers / nr;
  switch (r.sharing) {
    case Sharing::kNone:
      AddSegment(&plan, n, 1);
      break;
    case Sharing::kCycle:
      AddSegment(&plan, k, nr);
      break;
    case Sharing::kSequence:
      for (int i = 0; i < k; ++i) AddSegment(&plan, 1, nr);
      break;
    case Sharing::kMiddleCycle:
      AddSegment(&plan, first, 1);
      AddSegment(&plan, k, nr);
      AddSegment(&plan, last, 1);
      break;
    case Sharing::kMiddleSequence:
      AddSegment(&plan, first, 1);
      for (int i = 0; i < k; ++i) AddSegment(&plan, 1, nr);
      AddSegment(&plan, last, 1);
      break;
  }
  int looped = 0;
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    if (plan.segments[s].looped()) {
      ++looped;
      plan.looped_segment = s;
    }
  }
  if (looped != 1) plan.looped_segment = -1;
  if (r.routing != Routing::kNone && looped != 1) {
    return PlanError("recursion.routing",
                     absl::StrCat(RoutingName(r.routing), " needs exactly one looped segment; ",
                                  SharingName(r.sharing), " with these sizes makes ", looped));
  }
  return plan;
}

int LayerPlan::UnrolledLayer(int segment, int loop, int k) const {
  int base = 0;
  for (int s = 0; s < segment; ++s) base += segments[s].num_layers * segments[s].loops;
  return base + loop * segments[segment].num_layers + k;
}

int LayerPlan::CacheSlot(int segment, int loop, int k) const {
  const Segment& s = segments[segment];
  const bool shared = kv == KvMode::kShared && s.looped();
  return s.first_cache_slot + (shared ? k : loop * s.num_layers + k);
}

int LayerPlan::num_unrolled_layers() const {
  int n = 0;
  for (const Segment& s : segments) n += s.num_layers * s.loops;
  return n;
}

std::string LayerPlan::Describe() const {
  std::string out = absl::StrCat("sharing ", SharingName(sharing), ", kv ", KvModeName(kv), ", ",
                                 num_unrolled_layers(), " unrolled layers, ", num_layer_slots,
                                 " stored layer positions, ", num_cache_slots, " KV cache slots\n");
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    absl::StrAppend(&out, "  segment ", i, ": ", s.num_layers, " layer(s) x ", s.loops,
                    s.looped() ? " loops" : " (unique)", ", layer slots ", s.first_layer_slot, "..",
                    s.first_layer_slot + s.num_layers - 1, ", unrolled layers ",
                    UnrolledLayer(static_cast<int>(i), 0, 0), "..",
                    UnrolledLayer(static_cast<int>(i), s.loops - 1, s.num_layers - 1), "\n");
  }
  return out;
}

}  // namespace morserve
