// The sampler's token constraints on values: allowed_token_ids, logit_bias and min_tokens
// (vLLM v1's order: allowed ids, then bias and min_tokens, then penalties). A bias that flips
// the greedy choice, -100 that bans and +100 that forces a token at temperature 1, the exact
// processed row, min_tokens banning eos and stop ids exactly until the count, allowed ids
// restricting greedy and sampled tokens, logprobs staying raw, and a zero bias changing
// nothing bit for bit (the random stream does not depend on the parameters).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "engine/runtime/sampler.h"
#include "gtest/gtest.h"

namespace morserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(gen);
  return logits;
}

SampleInput Input(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed,
                  absl::Span<const int> output = {}, absl::Span<const int> eos = {}) {
  SampleInput in;
  in.logits = logits;
  in.params = &p;
  in.output_ids = output;
  in.eos_ids = eos;
  in.seed = seed;
  return in;
}

int Argmax(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

TEST(SamplerConstraintsTest, BiasFlipsTheGreedyChoice) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {1.0f, 2.0f, 1.5f};
  EXPECT_EQ(sampler.Sample(Input(logits, p, 1)).token, 1);
  p.logit_bias = {{2, 0.6f}};  // 2.1 > 2.0
  EXPECT_EQ(sampler.Sample(Input(logits, p, 1)).token, 2);
  p.logit_bias = {{2, 0.4f}};  // 1.9 < 2.0
  EXPECT_EQ(sampler.Sample(Input(logits, p, 1)).token, 1);
  p.logit_bias = {{1, -1.5f}, {0, 0.25f}};  // 0.5, 1.25, 1.5
  EXPECT_EQ(sampler.Sample(Input(logits, p, 1)).token, 2);
  const absl::Span<const float> row = sampler.ProcessLogits(Input(logits, p, 1));
  EXPECT_EQ(row[0], 1.25f);
  EXPECT_EQ(row[1], 0.5f);
  EXPECT_EQ(row[2], 1.5f);
}

TEST(SamplerConstraintsTest, MinusHundredBansAndPlusHundredForcesAtTemperatureOne) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(5000, 3);
  const int best = Argmax(logits);
  SamplingParams banned;
  banned.logit_bias = {{best, -100.0f}};
  SamplingParams forced;
  const int weak =
      static_cast<int>(std::min_element(logits.begin(), logits.end()) - logits.begin());
  forced.logit_bias = {{weak, 100.0f}};
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    ASSERT_NE(sampler.Sample(Input(logits, banned, seed)).token, best) << "seed " << seed;
    ASSERT_EQ(sampler.Sample(Input(logits, forced, seed)).token, weak) << "seed " << seed;
  }
  banned.temperature = 0.0f;
  std::vector<float> without = logits;
  without[best] = kNegInf;
  EXPECT_EQ(sampler.Sample(Input(logits, banned, 0)).token, Argmax(without));
}

TEST(SamplerConstraintsTest, BiasComesBeforeThePenalties) {
  Sampler sampler;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{0, 2.0f}, {1, -3.0f}};
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f};
  const std::vector<int> output = {0, 1};
  const absl::Span<const float> row = sampler.ProcessLogits(Input(logits, p, 0, output));
  EXPECT_FLOAT_EQ(row[0], (2.0f + 2.0f) / 2.0f - 0.5f);  // biased 4 > 0: divided
  EXPECT_FLOAT_EQ(row[1], (1.0f - 3.0f) * 2.0f - 0.5f);  // biased -2 <= 0: multiplied
  EXPECT_FLOAT_EQ(row[2], 0.5f);
}

TEST(SamplerConstraintsTest, MinTokensBansEosAndStopIdsExactlyUntilTheCount) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 3;
  p.stop_token_ids = {4};
  const std::vector<int> eos = {0, 7};
  // eos 0 is the argmax, stop id 4 second, eos 7 third, then 5.
  const std::vector<float> logits = {9.0f, 1.0f, 2.0f, 0.0f, 8.0f, 6.0f, -1.0f, 7.0f};
  std::vector<int> output;
  for (int step = 0; step < 5; ++step) {
    const SampleResult r = sampler.Sample(Input(logits, p, 11, output, eos));
    const absl::Span<const float> row = sampler.ProcessLogits(Input(logits, p, 11, output, eos));
    if (step < p.min_tokens) {
      EXPECT_EQ(r.token, 5) << "step " << step;
      for (int id : {0, 4, 7}) EXPECT_EQ(row[id], kNegInf) << "step " << step << " id " << id;
    } else {
      EXPECT_EQ(r.token, 0) << "step " << step;
      for (int id = 0; id < 8; ++id) EXPECT_EQ(row[id], logits[id]) << "step " << step;
    }
    // The reported logprob is of the raw row, banned or not.
    double z = 0.0;
    for (float x : logits) z += std::exp(static_cast<double>(x) - 9.0);
    EXPECT_NEAR(r.logprob, logits[r.token] - 9.0 - std::log(z), 1e-5) << "step " << step;
    output.push_back(r.token);
  }
  // ignore_eos does not lift the ban (vLLM counts eos among the ids min_tokens bans).
  p.ignore_eos = true;
  EXPECT_EQ(sampler.Sample(Input(logits, p, 11, {}, eos)).token, 5);
  // Sampled (temperature 1) requests never draw a banned id before the count.
  SamplingParams hot = p;
  hot.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    const int t = sampler.Sample(Input(logits, hot, seed, {}, eos)).token;
    ASSERT_TRUE(t != 0 && t != 4 && t != 7) << "seed " << seed << " drew " << t;
  }
}

TEST(SamplerConstraintsTest, AllowedIdsRestrictGreedyAndSampledTokens) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(3000, 5);
  const std::vector<int> allowed = {17, 400, 2999, 5};
  int best = allowed[0];
  for (int id : allowed) {
    if (logits[id] > logits[best]) best = id;
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.allowed_token_ids = allowed;
  EXPECT_EQ(sampler.Sample(Input(logits, greedy, 0)).token, best);

  SamplingParams hot;
  hot.allowed_token_ids = allowed;
  hot.temperature = 4.0f;  // flat enough that every allowed id is drawn
  std::set<int> drawn;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    const int t = sampler.Sample(Input(logits, hot, seed)).token;
    ASSERT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << "drew " << t;
    drawn.insert(t);
  }
  EXPECT_EQ(drawn, std::set<int>(allowed.begin(), allowed.end()));

  // A bias cannot bring back an id outside the allowed set (-inf + 100 is -inf).
  hot.logit_bias = {{Argmax(logits), 100.0f}};
  if (std::find(allowed.begin(), allowed.end(), Argmax(logits)) == allowed.end()) {
    for (uint64_t seed = 0; seed < 200; ++seed) {
      EXPECT_NE(sampler.Sample(Input(logits, hot, seed)).token, Argmax(logits));
    }
  }
  // top_k = 1 inside the allowed set is greedy within it.
  SamplingParams topk = greedy;
  topk.temperature = 1.0f;
  topk.top_k = 1;
  EXPECT_EQ(sampler.Sample(Input(logits, topk, 9)).token, best);
}

TEST(SamplerConstraintsTest, LogprobsStayRawUnderEveryConstraint) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(2000, 8);
  SamplingParams plain;
  plain.temperature = 0.0f;
  plain.logprobs = 5;
  SamplingParams constrained = plain;
  constrained.allowed_token_ids = std::vector<int>{3, 30, 300};
  constrained.logit_bias = {{30, 50.0f}};
  const SampleResult a = sampler.Sample(Input(logits, plain, 0));
  const SampleResult b = sampler.Sample(Input(logits, constrained, 0));
  EXPECT_EQ(b.token, 30);
  const double log_z = LogSumExp(logits);
  EXPECT_FLOAT_EQ(b.logprob, static_cast<float>(logits[30] - log_z));
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
  for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
    EXPECT_EQ(a.top_logprobs[i].token, b.top_logprobs[i].token);
    EXPECT_EQ(a.top_logprobs[i].logprob, b.top_logprobs[i].logprob);
  }
}

TEST(SamplerConstraintsTest, ZeroBiasAndAllowingEveryIdChangeNothing) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(1000, 12);
  SamplingParams plain;
  plain.top_p = 0.9f;
  SamplingParams same = plain;
  same.logit_bias = {{0, 0.0f}, {500, 0.0f}};
  same.allowed_token_ids.emplace(1000);
  for (int i = 0; i < 1000; ++i) (*same.allowed_token_ids)[i] = i;
  same.min_tokens = 2;  // no eos ids and no stop ids: nothing to ban
  for (uint64_t seed = 0; seed < 300; ++seed) {
    ASSERT_EQ(sampler.Sample(Input(logits, plain, seed)).token,
              sampler.Sample(Input(logits, same, seed)).token)
        << "seed " << seed;
  }
}

}  // namespace
}  // namespace morserve
