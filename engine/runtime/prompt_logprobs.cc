// Prompt-token scoring (see prompt_logprobs.h).
#include "engine/runtime/prompt_logprobs.h"

#include "engine/core/check.h"

namespace morserve {

PromptTokenLogprob ScorePromptToken(absl::Span<const float> logits, int token, int top_k,
                                    std::vector<int>* scratch) {
  MORSERVE_CHECK(token >= 0 && token < static_cast<int>(logits.size()),
                 "scored token outside the vocabulary");
  PromptTokenLogprob out;
  out.token = token;
  const double log_z = LogSumExp(logits);
  const float mine = logits[token];
  out.logprob = static_cast<float>(static_cast<double>(mine) - log_z);
  // vLLM counts logprobs >= the token's own; on logits that is the same order (one shift).
  int at_least = 0;
  for (float x : logits) at_least += x >= mine ? 1 : 0;
  out.rank = at_least;
  if (top_k > 0) TopLogprobs(logits, log_z, top_k, scratch, &out.top_logprobs);
  return out;
}

}  // namespace morserve
