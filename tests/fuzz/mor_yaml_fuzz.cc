// Fuzzes the import of official Mixture-of-Recursions run configs (engine/convert/mor_yaml.cc,
// yaml-cpp underneath) on arbitrary YAML text. Property: what it accepts is a recursion object
// that the config parser accepts beside a small valid Llama config, or it is an error.
#include "engine/convert/mor_yaml.h"
#include "engine/model/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace morserve;
  absl::StatusOr<nlohmann::json> r =
      MorRunConfigToRecursion(std::string(fuzz::AsText(data, size)), "fuzz.yaml");
  if (!r.ok()) {
    fuzz::Check(!r.status().message().empty(), "an error says what is wrong");
    return 0;
  }
  if (r->is_null()) return 0;  // not a recursive run
  fuzz::Check(r->is_object(), "the recursion object is an object");
  // The converter writes it beside the base model's config; parse it there (errors allowed:
  // the YAML may ask for more loops than this base has layers).
  nlohmann::json config = {{"hidden_size", 64},       {"num_hidden_layers", 24},
                           {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                           {"intermediate_size", 128}, {"vocab_size", 256},
                           {"model_type", "llama"},    {"recursion", *r}};
  (void)ParseModelConfig(config, nullptr);
  return 0;
}
