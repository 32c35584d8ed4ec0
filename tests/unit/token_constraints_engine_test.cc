// logit_bias, min_tokens and allowed_token_ids through the engine on tiny models: a +100 bias
// makes greedy output all one token, allowed ids hold every token inside the set (and equal
// the argmax of the returned raw logits over it), min_tokens keeps a model whose greedy first
// token is EOS going exactly until the count, and a request's tokens and logits do not change
// with batch neighbours that use these parameters (depth-wise and sequence-wise, MoR too).
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::RunResult;

EngineConfig Config(BatchingMode mode) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 1024;
  return cfg;
}

std::vector<RunResult> RunRequests(const std::shared_ptr<const ModelWeights>& weights,
                                   const std::vector<GenerateRequest>& requests,
                                   const std::vector<int>& arrivals,
                                   BatchingMode mode = BatchingMode::kDepthWise) {
  auto engine = Engine::Create(weights, Config(mode));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  return testing::RunStaggered(engine->get(), requests, arrivals);
}

const std::vector<int> kPrompt = {5, 9, 14, 3, 27, 8};

TEST(TokenConstraintsEngineTest, LargeBiasMakesGreedyOutputOneToken) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  GenerateRequest plain = testing::Greedy(kPrompt, 8);
  const RunResult base = RunRequests(weights, {plain}, {0})[0];
  ASSERT_EQ(base.tokens.size(), 8u);
  const int x = base.tokens[0] == 77 ? 78 : 77;
  GenerateRequest biased = plain;
  biased.params.logit_bias = {{x, 100.0f}};
  const RunResult got = RunRequests(weights, {biased}, {0})[0];
  EXPECT_EQ(got.tokens, std::vector<int>(8, x));
  // -100 on the unbiased first token moves greedy to the runner-up of the same logits.
  GenerateRequest banned = plain;
  banned.params.logit_bias = {{base.tokens[0], -100.0f}};
  const RunResult b = RunRequests(weights, {banned}, {0})[0];
  std::vector<float> row = base.logits[0];
  row[base.tokens[0]] = -1e30f;
  EXPECT_EQ(b.tokens[0], std::max_element(row.begin(), row.end()) - row.begin());
  EXPECT_EQ(b.logits[0], base.logits[0]) << "the returned logits are the raw model output";
}

TEST(TokenConstraintsEngineTest, AllowedIdsHoldEveryTokenInsideTheSet) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  const std::vector<int> allowed = {10, 20, 30, 40};
  GenerateRequest r = testing::Greedy(kPrompt, 10);
  r.params.allowed_token_ids = allowed;
  const RunResult got = RunRequests(weights, {r}, {0})[0];
  ASSERT_EQ(got.tokens.size(), 10u);
  for (size_t t = 0; t < got.tokens.size(); ++t) {
    int best = allowed[0];
    for (int id : allowed) {
      if (got.logits[t][id] > got.logits[t][best]) best = id;
    }
    EXPECT_EQ(got.tokens[t], best) << "token " << t;
  }
}

// A model whose greedy first token is EOS: the same weights with eos_token_ids set to the
// token the unconstrained run produces first.
TEST(TokenConstraintsEngineTest, MinTokensHoldsEosBackExactlyUntilTheCount) {
  testing::TempDir probe_dir;
  TinyModelSpec spec = testing::F32Spec("vanilla");
  const RunResult probe =
      RunRequests(testing::MakeModel(spec, &probe_dir), {testing::Greedy(kPrompt, 1)}, {0})[0];
  ASSERT_EQ(probe.tokens.size(), 1u);
  const int first = probe.tokens[0];
  spec.eos_token_ids = {first};
  testing::TempDir dir;
  auto weights = testing::MakeModel(spec, &dir);

  GenerateRequest r = testing::Greedy(kPrompt, 12);
  r.params.ignore_eos = false;
  const RunResult stops = RunRequests(weights, {r}, {0})[0];
  EXPECT_EQ(stops.tokens, std::vector<int>{first});
  EXPECT_EQ(stops.finish, FinishReason::kStop);

  for (int min_tokens : {1, 4, 12}) {
    r.params.min_tokens = min_tokens;
    const RunResult got = RunRequests(weights, {r}, {0})[0];
    const std::string at = "min_tokens " + std::to_string(min_tokens);
    ASSERT_GE(got.tokens.size(), static_cast<size_t>(min_tokens)) << at;
    for (int t = 0; t < min_tokens; ++t) EXPECT_NE(got.tokens[t], first) << at << " token " << t;
    if (got.finish == FinishReason::kStop) {
      EXPECT_EQ(got.tokens.back(), first) << at;
      EXPECT_GT(got.tokens.size(), static_cast<size_t>(min_tokens)) << at;
    } else {
      EXPECT_EQ(got.finish, FinishReason::kLength) << at;
      EXPECT_EQ(got.tokens.size(), 12u) << at;
    }
    // Greedy after the count: the first unconstrained step is the raw argmax.
    if (got.tokens.size() > static_cast<size_t>(min_tokens)) {
      const std::vector<float>& row = got.logits[min_tokens];
      EXPECT_EQ(got.tokens[min_tokens], std::max_element(row.begin(), row.end()) - row.begin())
          << at;
    }
  }
  // The same through a stop token id instead of EOS, with ignore_eos.
  GenerateRequest s = testing::Greedy(kPrompt, 12);
  s.params.stop_token_ids = {first};
  s.params.min_tokens = 3;
  const RunResult held = RunRequests(weights, {s}, {0})[0];
  for (int t = 0; t < 3; ++t) EXPECT_NE(held.tokens[t], first) << "token " << t;
}

// Requests alone and among neighbours that use every constraint, arriving at different steps.
TEST(TokenConstraintsEngineTest, OutputsDoNotDependOnConstrainedNeighbours) {
  for (const std::string family : {"vanilla", "mor-tc"}) {
    testing::TempDir dir;
    auto weights = testing::MakeModel(testing::F32Spec(family), &dir);
    const int vocab = weights->config.vocab_size;
    std::vector<GenerateRequest> reqs;
    reqs.push_back(testing::Greedy(kPrompt, 9));  // plain greedy
    GenerateRequest seeded = testing::Greedy({7, 7, 1, 40}, 9);
    seeded.params.temperature = 0.8f;
    seeded.params.seed = 1234;
    reqs.push_back(seeded);  // plain sampled
    GenerateRequest bias = testing::Greedy({100, 3, 3}, 7);
    bias.params.logit_bias = {{11, 4.0f}, {12, -100.0f}, {vocab - 1, 2.5f}};
    bias.params.temperature = 1.0f;
    bias.params.seed = 9;
    reqs.push_back(bias);
    GenerateRequest min = testing::Greedy({60, 61, 62, 63, 64}, 8);
    min.params.ignore_eos = false;
    min.params.min_tokens = 6;
    min.params.stop_token_ids = {1, 4};
    reqs.push_back(min);
    GenerateRequest allowed = testing::Greedy({9, 8, 7, 6, 5, 4, 3}, 6);
    allowed.params.allowed_token_ids = std::vector<int>{2, 50, 51, 52};
    reqs.push_back(allowed);
    for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
      const std::vector<RunResult> together = RunRequests(weights, reqs, {0, 1, 0, 2, 1}, mode);
      ASSERT_EQ(together.size(), reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) {
        const RunResult alone = RunRequests(weights, {reqs[i]}, {0}, mode)[0];
        const std::string at = family + " request " + std::to_string(i);
        EXPECT_EQ(together[i].tokens, alone.tokens) << at;
        EXPECT_EQ(together[i].logits, alone.logits) << at;
        EXPECT_EQ(together[i].finish, alone.finish) << at;
      }
      for (int t : together[4].tokens) EXPECT_TRUE(t == 2 || (t >= 50 && t <= 52)) << t;
      EXPECT_EQ(together[2].tokens.size(), 7u);
      for (int t : together[2].tokens) EXPECT_NE(t, 12);
    }
  }
}

}  // namespace
}  // namespace morserve
