// Per-request sampling parameters, as the engine sees them after the front end has parsed
// the request (TGI's "parse and validate at the edge"). Semantics follow vLLM's
// SamplingParams (docs/models.md#sampling, docs/cli.md#sampling-parameters):
//   - temperature < kGreedyTemperature (vLLM's _SAMPLING_EPS) means greedy; greedy ignores
//     top_k / top_p / min_p but still applies the penalties.
//   - top_k 0 or -1 disables top-k; top_k >= vocab is the same as off.
//   - top_p in (0, 1], 1 disables; min_p in [0, 1], 0 disables.
//   - repetition_penalty > 0 (1 disables) applies to tokens of prompt and output;
//     presence / frequency penalties in [-2, 2] apply to output tokens only.
//   - logprobs: number of top alternatives to report per token, 0..kMaxLogprobs.
//   - prompt_logprobs (vLLM's): unset, or the top alternatives to report for every prompt
//     token after the first, 0..kMaxLogprobs. With it max_tokens may be 0 (score the prompt,
//     generate nothing: lm-eval's loglikelihood requests).
//   - allowed_token_ids (vLLM's): when set, non-empty ids in the vocabulary; every other
//     token's logit is -inf before anything else.
//   - logit_bias (OpenAI's): (token id, bias in [-100, 100]) pairs, each id at most once,
//     added to the logit before the penalties (and before greedy's argmax).
//   - min_tokens (vLLM's): 0..max_tokens; until that many tokens have been generated the
//     end-of-sequence ids and stop_token_ids are banned (-inf, even with ignore_eos, as
//     vLLM does) and stop strings cannot end the request (the server's TextStream).
//   Reported logprobs stay those of the raw model output (vLLM's default), so none of these
//   three changes a reported logprob; they change which token is chosen.
// Validate() is the only gate: the sampler assumes validated parameters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace morserve {

inline constexpr float kGreedyTemperature = 1e-5f;
inline constexpr int kMaxLogprobs = 20;
inline constexpr float kMaxLogitBias = 100.0f;  // OpenAI's range is [-100, 100]

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0 or -1: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;  // none: a random seed is drawn when the request is created
  std::vector<int> stop_token_ids;
  std::vector<std::string> stop;
  int max_tokens = 16;
  int logprobs = 0;                    // top-n alternatives to report, 0..kMaxLogprobs
  std::optional<int> prompt_logprobs;  // none: the prompt is not scored
  bool ignore_eos = false;
  int min_tokens = 0;  // EOS and stop_token_ids banned while fewer have been generated
  std::vector<std::pair<int, float>> logit_bias;      // (token id, bias), ids distinct
  std::optional<std::vector<int>> allowed_token_ids;  // none: every token

  bool greedy() const { return temperature < kGreedyTemperature; }
};

// True when the next token needs only the chosen token's logprob (no top-n alternatives):
// what ModelRunner::Sample computes where the logits are, every other sampler stage included
// (allowed ids, logit bias, min_tokens, penalties, temperature, top_k/top_p/min_p, the seeded
// draw).
bool RunnerSamples(const SamplingParams& params);

// INVALID_ARGUMENT naming the first offending field, OK otherwise. `eos_ids` are the
// model's end-of-sequence ids: with min_tokens > 0, allowed_token_ids made only of them and
// stop_token_ids would leave nothing to sample, which is refused here rather than in the
// sampler.
absl::Status Validate(const SamplingParams& params, int vocab_size,
                      absl::Span<const int> eos_ids = {});

}  // namespace morserve
