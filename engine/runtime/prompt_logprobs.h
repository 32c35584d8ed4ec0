// Prompt logprobs (vLLM's `prompt_logprobs`; OpenAI's `echo` with `logprobs`): for a prompt
// token at position p >= 1, the log-probability the model gave it from the final hidden state
// of position p - 1, its rank in the vocabulary, and the top-k alternatives. The values are
// computed exactly as the sampled tokens' logprobs are (sampler.h: raw log_softmax of the
// model's logits, before penalties and temperature), so a prompt token scored here and the
// same token sampled after the same context carry the same number.
#pragma once

#include <vector>

#include "absl/types/span.h"
#include "engine/runtime/sampler.h"

namespace morserve {

struct PromptTokenLogprob {
  int token = -1;      // the prompt token being scored
  float logprob = 0.0f;
  int rank = 0;        // tokens whose logit is >= its own, itself included (vLLM's; 1: best)
  std::vector<TokenLogprob> top_logprobs;  // the k best, best first
};

// Scores `token` against one row of logits, with the `top_k` best alternatives. `scratch` is
// reused between calls.
PromptTokenLogprob ScorePromptToken(absl::Span<const float> logits, int token, int top_k,
                                    std::vector<int>* scratch);

}  // namespace morserve
