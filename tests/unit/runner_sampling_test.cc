// The runner samples the next token of requests that need no logits on the host
// (ModelRunner::Sample, RunnerSamples): on the CPU backend its tokens and logprobs equal the
// engine's host sampler bit for bit (the same requests asking for logits), in both batching
// modes and for plain, MoR and adaptive Huginn models; the runner counts exactly the rows it
// sampled (with Huginn, also the tokens an exit check let leave early: their logits stay in the
// runner too): every row but those asking for top-n alternatives, penalties, logit bias, allowed
// ids and min_tokens bans included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/runtime/engine.h"
#include "tests/engine_harness.h"
#include "tests/engine_sampling.h"

namespace morserve {
namespace {

using testing::RunResult;

EngineConfig Config(BatchingMode mode) {
  EngineConfig c;
  c.mode = mode;
  c.max_batch_rows = 12;
  c.max_step_tokens = 10;
  c.block_size = 4;
  c.num_kv_blocks = 2048;
  return c;
}

struct Outcome {
  std::vector<RunResult> results;
  int64_t runner_sampled = 0;
};

Outcome RunAll(const std::shared_ptr<const ModelWeights>& w, BatchingMode mode,
               const std::vector<GenerateRequest>& requests) {
  auto engine = Engine::Create(w, Config(mode));
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<int> arrivals;
  for (size_t i = 0; i < requests.size(); ++i) arrivals.push_back(static_cast<int>(i % 4));
  Outcome r;
  r.results = testing::RunStaggered(engine->get(), requests, arrivals);
  r.runner_sampled = (*engine)->runner().counters().sampled_rows;
  return r;
}

TinyModelSpec Family(const std::string& name) {
  for (const testing::FamilyCase& c : testing::EngineFamilies(testing::F32Spec)) {
    if (c.name == name) return c.spec;
  }
  ADD_FAILURE() << "no family " << name;
  return testing::F32Spec("vanilla");
}

TEST(RunnerSamplingTest, EqualsTheHostSamplerBitwise) {
  for (const char* name : {"vanilla", "mor-ec", "huginn-adaptive"}) {
    testing::TempDir dir;
    auto w = testing::MakeModel(Family(name), &dir);
    ASSERT_NE(w, nullptr);
    const std::vector<GenerateRequest> requests =
        testing::RunnerSampledRequests(w->config.vocab_size, 10);
    for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
      SCOPED_TRACE(std::string(name) + (mode == BatchingMode::kDepthWise ? " depth" : " seq"));
      const Outcome runner = RunAll(w, mode, requests);
      const Outcome host = RunAll(w, mode, testing::WithLogits(requests));
      const bool huginn = std::string(name) == "huginn-adaptive";
      int generated = 0, early = 0;
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ(runner.results[i].tokens, host.results[i].tokens) << "request " << i;
        EXPECT_EQ(runner.results[i].logprobs, host.results[i].logprobs) << "request " << i;
        EXPECT_EQ(runner.results[i].loops, host.results[i].loops) << "request " << i;
        for (int loops : runner.results[i].loops) {
          ++generated;
          early += loops < w->config.recursion.num_recursions;
        }
      }
      EXPECT_EQ(runner.runner_sampled, generated);
      EXPECT_GT(generated, 0);
      if (huginn) EXPECT_GT(early, 0) << "no token exited early";
      EXPECT_EQ(host.runner_sampled, 0);
    }
  }
}

TEST(RunnerSamplingTest, TheRunnerSamplesEveryRowButAlternatives) {
  testing::TempDir dir;
  auto w = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  ASSERT_NE(w, nullptr);
  GenerateRequest base = testing::RunnerSampledRequests(w->config.vocab_size, 1)[0];
  auto sampled_by_runner = [&](const GenerateRequest& r) {
    return RunAll(w, BatchingMode::kDepthWise, {r}).runner_sampled;
  };
  EXPECT_EQ(sampled_by_runner(base), 8);
  GenerateRequest penalty = base;
  penalty.params.repetition_penalty = 1.2f;
  EXPECT_EQ(sampled_by_runner(penalty), 8);
  GenerateRequest alternatives = base;
  alternatives.params.logprobs = 2;
  EXPECT_EQ(sampled_by_runner(alternatives), 0);
  GenerateRequest bias = base;
  bias.params.logit_bias = {{3, 1.5f}};
  EXPECT_EQ(sampled_by_runner(bias), 8);
  GenerateRequest allowed = base;
  allowed.params.allowed_token_ids = std::vector<int>{1, 2, 3};
  EXPECT_EQ(sampled_by_runner(allowed), 8);
  GenerateRequest min_tokens = base;
  min_tokens.params.min_tokens = 3;  // tokens 0..2 ban EOS, on the runner too
  EXPECT_EQ(sampled_by_runner(min_tokens), 8);
}

}  // namespace
}  // namespace morserve
