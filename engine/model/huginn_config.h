// config.json of Huginn-0125 (model_type huginn_raven, RavenForCausalLM;
// docs/models.md#huginn-0125): its own field names (n_embd, n_layers_in_prelude, mean_recurrence,
// ...), read into the ModelConfig every path uses: a middle_cycle plan of prelude P + core C x
// mean_recurrence + coda D layers and the HuginnConfig switches. Strict: a field that would change
// the math and is not the released value is an error naming it, and so is an unknown field.
#pragma once

#include "absl/status/status.h"
#include "engine/model/config.h"
#include "nlohmann/json.hpp"

namespace morserve {

absl::Status ParseHuginnConfig(const nlohmann::json& c, ModelConfig* m);

}  // namespace morserve
