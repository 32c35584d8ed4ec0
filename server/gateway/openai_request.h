// Parsing and type-checking of OpenAI /v1/completions and /v1/chat/completions bodies (plus
// vLLM's extra fields: min_tokens, allowed_token_ids, cache_salt, ...; OpenAI's logit_bias;
// the looped-model fields mode and exit_threshold, passed to GenerateRequest's, and
// return_loops, the gateway's own: each token's loop count in the response) into the gRPC
// GenerateRequests the gateway sends: one per choice, choice index = prompt index * n +
// sample index, seeds seed, seed+1, ... per prompt. Unknown fields are ignored as OpenAI
// does; null counts as absent. Completions may ask for prompt logprobs (echo with logprobs,
// or vLLM's prompt_logprobs) and for max_tokens 0 with them or with echo (the prompt alone,
// scored by the backend, nothing generated). Chat takes vLLM's prompt_logprobs for the
// rendered chat prompt (not with stream, as vLLM; only the first choice's call asks the
// backend, the response carries one list). Range checks that the backend makes
// (temperature, top_p, penalties, max_tokens against the context) are left to it, so there
// is one source of truth; its INVALID_ARGUMENT comes back as a 400.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "morserve/v1/morserve.pb.h"
#include "server/gateway/api_error.h"

namespace morserve::gateway {

enum class Endpoint { kCompletions, kChat };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                       // empty: the served model
  std::vector<v1::GenerateRequest> calls;  // one per choice
  int n = 1;
  int num_prompts = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt's text before the output
  int logprobs = -1;           // completions: logprobs (0..20); chat: top_logprobs; -1: none
  // vLLM's prompt_logprobs (0..20); -1: none. Chat: never with stream (a 400, or 0 dropped).
  int prompt_logprobs = -1;
  // Completions with echo and logprobs: the prompt tokens' entries lead the logprobs object
  // (the first with null logprob and top_logprobs, as OpenAI's legacy API and vLLM).
  bool echo_logprobs() const { return echo && logprobs >= 0; }
  // Extra body field `return_loops` (a morserve extension, as vLLM's extras): each choice's
  // `token_loops` (loops of the shared block behind each generated token, in order; per
  // chunk when streaming) and usage's `recursion_loops` (over the prompt and output tokens).
  bool return_loops = false;
};

constexpr int kMaxChoices = 128;
constexpr int kMaxLogprobs = 20;

// Parses `text` (the request body); on failure the 400 error (message and param name the
// field).
std::optional<ApiError> ParseOpenAiRequest(Endpoint endpoint, std::string_view text,
                                           OpenAiRequest* out);

// POST /tokenize (vLLM's two shapes): {"prompt": "...", "add_special_tokens": bool (default
// true), "model"} or {"messages": [...], "add_generation_prompt": bool (default true),
// "add_special_tokens": bool (default false), "model"}; messages go to the backend as
// TokenizeRequest.chat and are rendered with its chat template.
std::optional<ApiError> ParseTokenizeRequest(std::string_view text, std::string* model,
                                             v1::TokenizeRequest* out);

}  // namespace morserve::gateway
