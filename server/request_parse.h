// Edge validation of morserve.v1.GenerateRequest into the engine's GenerateRequest (TGI's
// "parse and validate at the edge": the engine sees typed structs only). Errors are
// INVALID_ARGUMENT naming the proto field; text input without a tokenizer is
// FAILED_PRECONDITION. Range checks the engine also makes (sampling ranges, vocabulary,
// context) are left to Engine::Submit so there is one source of truth.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/request.h"
#include "morserve/v1/morserve.pb.h"

namespace morserve {

struct ParsedGenerate {
  GenerateRequest request;
  bool echo = false;
  bool skip_special_tokens = true;
};

absl::StatusOr<ParsedGenerate> ParseGenerateRequest(const v1::GenerateRequest& in);

}  // namespace morserve
