// SamplingParams validation: defaults pass, each invalid value is rejected with
// INVALID_ARGUMENT naming its field, and the boundaries of vLLM's ranges are accepted.
#include "engine/runtime/sampling_params.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace morserve {
namespace {

constexpr int kVocab = 100;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  std::string field;
  std::function<void(SamplingParams&)> mutate;
};

TEST(SamplingParamsTest, DefaultsAreValid) {
  SamplingParams p;
  EXPECT_TRUE(Validate(p, kVocab).ok());
  EXPECT_FALSE(p.greedy());
  p.temperature = 0.0f;
  EXPECT_TRUE(p.greedy());
}

TEST(SamplingParamsTest, RejectsEachInvalidValueNamingTheField) {
  const std::vector<Case> cases = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kNaN; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = kNaN; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.5f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = kNaN; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = kNaN; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -2.01f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = kNaN; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = 3.0f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -2.5f; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = 0; }},
      {"max_tokens", [](SamplingParams& p) { p.max_tokens = -5; }},
      {"max_tokens",
       [](SamplingParams& p) {
         p.max_tokens = -1;
         p.prompt_logprobs = 0;
       }},
      {"prompt_logprobs", [](SamplingParams& p) { p.prompt_logprobs = -1; }},
      {"prompt_logprobs", [](SamplingParams& p) { p.prompt_logprobs = kMaxLogprobs + 1; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = -1; }},
      {"logprobs", [](SamplingParams& p) { p.logprobs = kMaxLogprobs + 1; }},
      {"stop_token_ids",
       [](SamplingParams& p) {
         p.stop_token_ids = {1, kVocab};
       }},
      {"stop_token_ids", [](SamplingParams& p) { p.stop_token_ids = {-1}; }},
      {"stop",
       [](SamplingParams& p) {
         p.stop = {"ok", ""};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 1.0f}, {kVocab, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 100.5f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, -101.0f}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, kNaN}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, -kInf}};
       }},
      {"logit_bias",
       [](SamplingParams& p) {
         p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
       }},
      {"allowed_token_ids", [](SamplingParams& p) { p.allowed_token_ids.emplace(); }},
      {"allowed_token_ids",
       [](SamplingParams& p) {
         p.allowed_token_ids = {{0, kVocab}};
       }},
      {"allowed_token_ids", [](SamplingParams& p) { p.allowed_token_ids = {{-3}}; }},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = -1; }},
      {"min_tokens", [](SamplingParams& p) { p.min_tokens = p.max_tokens + 1; }},
      {"min_tokens",
       [](SamplingParams& p) {
         p.max_tokens = 0;
         p.prompt_logprobs = 0;
         p.min_tokens = 1;
       }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const absl::Status s = Validate(p, kVocab);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos)
        << "message '" << s.message() << "' does not name " << c.field;
  }
}

TEST(SamplingParamsTest, AcceptsRangeBoundaries) {
  const std::vector<std::function<void(SamplingParams&)>> ok = {
      [](SamplingParams& p) { p.temperature = 0.0f; },
      [](SamplingParams& p) { p.temperature = 100.0f; },
      [](SamplingParams& p) { p.top_k = -1; },
      [](SamplingParams& p) { p.top_k = 1; },
      [](SamplingParams& p) { p.top_k = 1000000; },  // larger than the vocabulary: off
      [](SamplingParams& p) { p.top_p = 1e-6f; },
      [](SamplingParams& p) { p.min_p = 1.0f; },
      [](SamplingParams& p) { p.repetition_penalty = 1e-3f; },
      [](SamplingParams& p) { p.repetition_penalty = 10.0f; },
      [](SamplingParams& p) { p.presence_penalty = -2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = 2.0f; },
      [](SamplingParams& p) { p.logprobs = kMaxLogprobs; },
      [](SamplingParams& p) {
        p.stop_token_ids = {0, kVocab - 1};
      },
      [](SamplingParams& p) {
        p.stop = {"\n\n", "END"};
      },
      [](SamplingParams& p) { p.seed = 0; },
      [](SamplingParams& p) { p.max_tokens = 1; },
      [](SamplingParams& p) { p.prompt_logprobs = kMaxLogprobs; },
      [](SamplingParams& p) {  // score the prompt only
        p.max_tokens = 0;
        p.prompt_logprobs = 0;
      },
      [](SamplingParams& p) {
        p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}, {5, 0.0f}};
      },
      [](SamplingParams& p) {
        p.allowed_token_ids = {{0, kVocab - 1, 0}};
      },
      [](SamplingParams& p) { p.min_tokens = p.max_tokens; },
      [](SamplingParams& p) {  // min_tokens with allowed ids that are not eos
        p.min_tokens = 3;
        p.allowed_token_ids = {{7}};
      },
  };
  for (size_t i = 0; i < ok.size(); ++i) {
    SamplingParams p;
    ok[i](p);
    EXPECT_TRUE(Validate(p, kVocab).ok()) << "case " << i << ": " << Validate(p, kVocab);
  }
}

// min_tokens bans the eos ids and stop_token_ids; allowed ids made only of those would leave
// nothing to sample before min_tokens is met.
TEST(SamplingParamsTest, MinTokensNeedsAnAllowedIdThatIsNotEosOrStop) {
  const std::vector<int> eos = {2};
  SamplingParams p;
  p.min_tokens = 1;
  p.allowed_token_ids = {{2}};
  absl::Status s = Validate(p, kVocab, eos);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().find("min_tokens"), 0u) << s;
  p.stop_token_ids = {5};
  p.allowed_token_ids = {{2, 5}};
  EXPECT_EQ(Validate(p, kVocab, eos).code(), absl::StatusCode::kInvalidArgument);
  p.allowed_token_ids = {{2, 5, 6}};
  EXPECT_TRUE(Validate(p, kVocab, eos).ok());
  p.allowed_token_ids = {{2, 5}};
  p.min_tokens = 0;  // nothing banned: eos and stop may end the request at once
  EXPECT_TRUE(Validate(p, kVocab, eos).ok());
  p.min_tokens = 1;
  EXPECT_TRUE(Validate(p, kVocab, {}).ok()) << "without eos ids only the stop id 5 is banned";
}

TEST(SamplingParamsTest, ReportsTheFirstInvalidField) {
  SamplingParams p;
  p.temperature = -1.0f;
  p.max_tokens = 0;
  const absl::Status s = Validate(p, kVocab);
  EXPECT_NE(s.message().find("temperature"), std::string::npos) << s;
}

}  // namespace
}  // namespace morserve
