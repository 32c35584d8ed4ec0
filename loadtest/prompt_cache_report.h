// What the server's prefix cache saved, from the usage of the measured requests that
// completed: prompt tokens, cached tokens (gRPC usage.cached_tokens, OpenAI
// usage.prompt_tokens_details.cached_tokens), prompt tokens computed (prompt - cached) and
// the cached fraction; and for the chat workload the same per turn with its TTFT summary
// (turn 0 shares only the system prompt with earlier conversations; later turns resend the
// whole conversation).
#pragma once

#include <vector>

#include "loadtest/request_record.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

// {"requests_with_usage", "prompt_tokens", "cached_tokens", "computed_prompt_tokens",
// "cached_fraction"}; null when no completed request reported cached tokens.
nlohmann::json PromptCacheJson(const std::vector<RequestRecord>& records);

// One entry per turn: {"turn", "completed", "failed", "ttft_ms" (summary),
// "mean_prompt_tokens", "mean_cached_tokens"}; empty when no record has a turn.
nlohmann::json ChatTurnsJson(const std::vector<RequestRecord>& records);

}  // namespace morserve::loadtest
