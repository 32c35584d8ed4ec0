// Validation of SamplingParams against vLLM's ranges (vllm/sampling_params.py
// _verify_args). NaN fails every range check because each check is written as "accept when
// in range", so a NaN never slips through a negated comparison.
#include "engine/runtime/sampling_params.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", why));
}

bool InClosed(float x, float lo, float hi) { return x >= lo && x <= hi; }

absl::Status ValidateFilters(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Invalid("temperature",
                   absl::StrCat("must be a finite number >= 0, got ", p.temperature));
  }
  if (p.top_k < -1) {
    return Invalid("top_k", absl::StrCat("must be -1 or 0 (disabled) or >= 1, got ", p.top_k));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return Invalid("top_p", absl::StrCat("must be in (0, 1], got ", p.top_p));
  }
  if (!InClosed(p.min_p, 0.0f, 1.0f)) {
    return Invalid("min_p", absl::StrCat("must be in [0, 1], got ", p.min_p));
  }
  return absl::OkStatus();
}

absl::Status ValidatePenalties(const SamplingParams& p) {
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return Invalid("repetition_penalty",
                   absl::StrCat("must be a finite number > 0, got ", p.repetition_penalty));
  }
  if (!InClosed(p.presence_penalty, -2.0f, 2.0f)) {
    return Invalid("presence_penalty",
                   absl::StrCat("must be in [-2, 2], got ", p.presence_penalty));
  }
  if (!InClosed(p.frequency_penalty, -2.0f, 2.0f)) {
    return Invalid("frequency_penalty",
                   absl::StrCat("must be in [-2, 2], got ", p.frequency_penalty));
  }
  return absl::OkStatus();
}

absl::Status ValidateOutput(const SamplingParams& p, int vocab_size) {
  if (p.prompt_logprobs && (*p.prompt_logprobs < 0 || *p.prompt_logprobs > kMaxLogprobs)) {
    return Invalid("prompt_logprobs",
                   absl::StrCat("must be in [0, ", kMaxLogprobs, "], got ", *p.prompt_logprobs));
  }
  if (p.max_tokens < 0 || (p.max_tokens == 0 && !p.prompt_logprobs)) {
    return Invalid(
        "max_tokens",
        absl::StrCat("must be at least 1 (0 only with prompt_logprobs), got ", p.max_tokens));
  }
  if (p.logprobs < 0 || p.logprobs > kMaxLogprobs) {
    return Invalid("logprobs",
                   absl::StrCat("must be in [0, ", kMaxLogprobs, "], got ", p.logprobs));
  }
  for (int id : p.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return Invalid(
          "stop_token_ids",
          absl::StrCat("contains ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) return Invalid("stop", "cannot contain an empty string");
  }
  return absl::OkStatus();
}

bool InVocab(int id, int vocab_size) { return id >= 0 && id < vocab_size; }

absl::Status ValidateLogitBias(const SamplingParams& p, int vocab_size) {
  std::unordered_set<int> seen;
  for (const auto& [id, bias] : p.logit_bias) {
    if (!InVocab(id, vocab_size)) {
      return Invalid("logit_bias", absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                                vocab_size, ")"));
    }
    if (!InClosed(bias, -kMaxLogitBias, kMaxLogitBias)) {
      return Invalid("logit_bias",
                     absl::StrCat("bias of token ", id, " must be in [-100, 100], got ", bias));
    }
    if (!seen.insert(id).second) {
      return Invalid("logit_bias", absl::StrCat("token id ", id, " appears more than once"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAllowed(const SamplingParams& p, int vocab_size) {
  if (!p.allowed_token_ids) return absl::OkStatus();
  if (p.allowed_token_ids->empty()) return Invalid("allowed_token_ids", "must not be empty");
  for (int id : *p.allowed_token_ids) {
    if (!InVocab(id, vocab_size)) {
      return Invalid(
          "allowed_token_ids",
          absl::StrCat("contains ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// min_tokens bans the EOS ids and stop_token_ids until it is met; with allowed_token_ids
// holding nothing else, no token could be sampled.
absl::Status ValidateMinTokens(const SamplingParams& p, absl::Span<const int> eos_ids) {
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return Invalid("min_tokens", absl::StrCat("must be in [0, max_tokens = ", p.max_tokens,
                                              "], got ", p.min_tokens));
  }
  if (p.min_tokens == 0 || !p.allowed_token_ids) return absl::OkStatus();
  auto banned = [&](int id) {
    return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end() ||
           std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) !=
               p.stop_token_ids.end();
  };
  if (std::all_of(p.allowed_token_ids->begin(), p.allowed_token_ids->end(), banned)) {
    return Invalid("min_tokens",
                   "cannot be met: every id in allowed_token_ids is an end-of-sequence or stop "
                   "token, which min_tokens bans");
  }
  return absl::OkStatus();
}

}  // namespace

bool RunnerSamples(const SamplingParams& p) { return p.logprobs == 0; }

absl::Status Validate(const SamplingParams& params, int vocab_size, absl::Span<const int> eos_ids) {
  if (absl::Status s = ValidateFilters(params); !s.ok()) return s;
  if (absl::Status s = ValidatePenalties(params); !s.ok()) return s;
  if (absl::Status s = ValidateOutput(params, vocab_size); !s.ok()) return s;
  if (absl::Status s = ValidateLogitBias(params, vocab_size); !s.ok()) return s;
  if (absl::Status s = ValidateAllowed(params, vocab_size); !s.ok()) return s;
  return ValidateMinTokens(params, eos_ids);
}

}  // namespace morserve
