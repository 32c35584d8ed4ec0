// Fuzzes the config.json parser (engine/model/config.cc: Llama, Nanbeige and Ouro configs,
// the recursion object, the strict key checks, looped.json defaults) and the layer plan built
// from what it accepts (engine/model/layer_plan.cc). Input: config.json text, optionally a
// NUL and the text of a recursion.json sidecar ("null" for none), optionally a NUL and the
// text of a looped.json. Properties: an accepted config has positive sizes, whole heads and
// kv groups; its recursion object serialises and parses back to the same plan; accepted
// looped defaults ask for adaptive depth only on a model with an exit rule.
#include "engine/model/config.h"
#include "engine/model/layer_plan.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using morserve::ModelConfig;
using morserve::fuzz::Check;

void CheckAccepted(const ModelConfig& c) {
  Check(c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 &&
            c.head_dim > 0 && c.intermediate_size > 0 && c.vocab_size > 0,
        "an accepted config has positive sizes");
  Check(c.num_heads % c.num_kv_heads == 0, "query heads are whole groups of kv heads");
  Check(c.recursion.num_recursions >= 1, "at least one recursion");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  const std::vector<std::string_view> parts = fuzz::SplitAtNul(fuzz::AsText(data, size), 3);
  const nlohmann::json config = nlohmann::json::parse(parts[0], nullptr, false);
  if (config.is_discarded()) return 0;
  nlohmann::json sidecar;
  if (parts.size() >= 2) {
    sidecar = nlohmann::json::parse(parts[1], nullptr, false);
    if (sidecar.is_discarded()) return 0;
  }
  const bool has_sidecar = parts.size() >= 2 && !sidecar.is_null();
  absl::StatusOr<ModelConfig> c = ParseModelConfig(config, has_sidecar ? &sidecar : nullptr);
  if (!c.ok()) {
    Check(!c.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  CheckAccepted(*c);
  (void)BuildLayerPlan(*c);
  if (parts.size() == 3) {
    const nlohmann::json looped = nlohmann::json::parse(parts[2], nullptr, false);
    ModelConfig d = *c;
    if (!looped.is_discarded()) {
      const absl::Status s = ApplyLoopedDefaults(looped, &d);
      Check(s.ok() || !s.message().empty(), "an error says what is wrong");
      Check(!s.ok() || d.recursion.default_loop_mode == LoopMode::kFull ||
                d.recursion.exit_rule != LoopExitRule::kNone,
            "adaptive depth only with an exit rule");
      Check(!s.ok() || d.recursion.loop_exit_threshold > 0, "a positive exit threshold");
    }
  }
  if (c->recursion.present && c->model_type == "llama") {
    // The recursion object round-trips: what mkmodel and inspect write reads back the same.
    nlohmann::json again = config;
    again["recursion"] = RecursionToJson(c->recursion);
    absl::StatusOr<ModelConfig> c2 = ParseModelConfig(again, nullptr);
    Check(c2.ok(), "a serialised recursion object parses");
    Check(RecursionToJson(c2->recursion) == RecursionToJson(c->recursion),
          "the recursion object round-trips");
  }
  return 0;
}
