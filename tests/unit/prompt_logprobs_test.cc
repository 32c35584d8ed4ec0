// Prompt logprobs (SamplingParams::prompt_logprobs) against the reference implementation, for
// every family the engine serves, in depth-wise and sequence-wise batching with chunked
// prefill: each prompt token after the first gets the logprob, rank and top-k alternatives
// of the reference's log_softmax of the previous position's logits.
//
// Tolerance: the engine's logits are within 1e-4 * max(|logit|, 1) of the reference's
// (engine_test), so a logprob (logit - logsumexp) is within 2e-4 * max(max |logit|, 1): the
// token's own logit error plus at most the largest logit error through the logsumexp.
// Ranks and top-k membership are checked up to ties closer than that tolerance.
//
// Also: the values are bit-identical alone, chunked, and inside a busy mixed batch; a prompt
// token scored here carries the same logprob as the same token sampled after the same
// context; max_tokens 0 scores without generating; validation errors name the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::RunResult;
using ::testing::HasSubstr;

constexpr double kLogitTolerance = 1e-4;

// One prompt position of the reference: log_softmax (fp64) of its logits, and the largest
// |logit| (the scale of the logits' tolerance).
struct ReferenceRow {
  std::vector<double> logprobs;
  double max_abs_logit = 1.0;
};

std::vector<ReferenceRow> ReferenceLogprobs(const std::shared_ptr<const ModelWeights>& w,
                                            const std::vector<int>& prompt) {
  ReferenceModel ref(w);
  std::vector<ReferenceRow> out;
  for (const StepOutput& o : ref.Forward(prompt)) {
    ReferenceRow row;
    double m = -INFINITY;
    for (float x : o.logits) {
      m = std::max(m, static_cast<double>(x));
      row.max_abs_logit = std::max(row.max_abs_logit, std::fabs(static_cast<double>(x)));
    }
    double sum = 0;
    for (float x : o.logits) sum += std::exp(x - m);
    for (float x : o.logits) row.logprobs.push_back(x - m - std::log(sum));
    out.push_back(std::move(row));
  }
  return out;
}

// Checks one request's prompt logprobs against the reference.
void ExpectMatchesReference(const std::shared_ptr<const ModelWeights>& w, const GenerateRequest& r,
                            const RunResult& got, const std::string& label) {
  ASSERT_TRUE(got.prompt_logprobs.has_value()) << label;
  EXPECT_EQ(got.prompt_logprob_events, 1) << label << ": sent more than once";
  const std::vector<PromptTokenLogprob>& entries = *got.prompt_logprobs;
  ASSERT_EQ(entries.size(), r.prompt.size() - 1) << label;
  const std::vector<ReferenceRow> ref = ReferenceLogprobs(w, r.prompt);
  const int k = *r.params.prompt_logprobs;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = label + " entry " + std::to_string(i);
    const PromptTokenLogprob& e = entries[i];
    const std::vector<double>& lp = ref[i].logprobs;  // position i predicts prompt token i + 1
    const double tol = 2 * kLogitTolerance * ref[i].max_abs_logit;
    ASSERT_EQ(e.token, r.prompt[i + 1]) << at;
    EXPECT_NEAR(e.logprob, lp[e.token], tol) << at;
    int lo = 1, hi = 0;
    for (double x : lp) {
      lo += x > lp[e.token] + tol ? 1 : 0;
      hi += x >= lp[e.token] - tol ? 1 : 0;
    }
    EXPECT_GE(e.rank, lo) << at;
    EXPECT_LE(e.rank, hi) << at;
    ASSERT_EQ(static_cast<int>(e.top_logprobs.size()), k) << at;
    std::vector<double> sorted = lp;
    std::sort(sorted.rbegin(), sorted.rend());
    for (int j = 0; j < k; ++j) {
      const TokenLogprob& t = e.top_logprobs[j];
      EXPECT_NEAR(t.logprob, lp[t.token], tol) << at << " top " << j;
      EXPECT_NEAR(t.logprob, sorted[j], tol) << at << " top " << j << " is not the j-th best";
      if (j > 0) EXPECT_GE(e.top_logprobs[j - 1].logprob, t.logprob) << at;
    }
  }
}

GenerateRequest Scored(const std::vector<int>& prompt, int max_tokens, int k) {
  GenerateRequest r = testing::Greedy(prompt, max_tokens);
  r.params.prompt_logprobs = k;
  return r;
}

struct Workload {
  std::vector<GenerateRequest> requests;
  std::vector<int> arrivals;
};

// Scored requests (k in {0, 2, 5, 20}, some with max_tokens 0) among unscored neighbours.
Workload MakeWorkload(int vocab) {
  Workload w;
  const auto prompts = testing::MakePrompts(12, 1, 24, vocab, 11);
  const int ks[] = {0, 2, 5, 20};
  for (int i = 0; i < 12; ++i) {
    if (i % 2 == 0) {
      w.requests.push_back(Scored(prompts[i], i % 4 == 0 ? 0 : 4, ks[(i / 2) % 4]));
    } else {
      w.requests.push_back(testing::Greedy(prompts[i], 3 + i % 4));
    }
    w.arrivals.push_back((i * 5) % 7);
  }
  return w;
}

void ExpectWorkloadResults(const std::shared_ptr<const ModelWeights>& weights, const Workload& w,
                           const std::vector<RunResult>& got, const std::string& label) {
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const GenerateRequest& r = w.requests[i];
    const std::string at = label + " request " + std::to_string(i);
    if (!r.params.prompt_logprobs) {
      EXPECT_FALSE(got[i].prompt_logprobs.has_value()) << at;
      EXPECT_EQ(got[i].tokens.size(), static_cast<size_t>(r.params.max_tokens)) << at;
      continue;
    }
    ExpectMatchesReference(weights, r, got[i], at);
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << at;
    EXPECT_EQ(got[i].tokens.size(), static_cast<size_t>(r.params.max_tokens)) << at;
    EXPECT_EQ(got[i].usage.completion_tokens, r.params.max_tokens) << at;
    EXPECT_EQ(got[i].usage.prompt_tokens, static_cast<int>(r.prompt.size())) << at;
  }
}

EngineConfig Config(BatchingMode mode, int step_tokens) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = step_tokens;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 4096;
  return cfg;
}

std::vector<RunResult> RunEngine(const std::shared_ptr<const ModelWeights>& weights, const EngineConfig& cfg,
                           const std::vector<GenerateRequest>& requests, const std::vector<int>& arrivals) {
  auto engine = Engine::Create(weights, cfg);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  std::vector<RunResult> out = testing::RunStaggered(engine->get(), requests, arrivals);
  EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << "blocks leaked";
  return out;
}

void ExpectBitIdentical(const RunResult& a, const RunResult& b, const std::string& label) {
  ASSERT_TRUE(a.prompt_logprobs && b.prompt_logprobs) << label;
  ASSERT_EQ(a.prompt_logprobs->size(), b.prompt_logprobs->size()) << label;
  for (size_t i = 0; i < a.prompt_logprobs->size(); ++i) {
    const PromptTokenLogprob& x = (*a.prompt_logprobs)[i];
    const PromptTokenLogprob& y = (*b.prompt_logprobs)[i];
    EXPECT_EQ(x.logprob, y.logprob) << label << " entry " << i;
    EXPECT_EQ(x.rank, y.rank) << label << " entry " << i;
    ASSERT_EQ(x.top_logprobs.size(), y.top_logprobs.size()) << label;
    for (size_t j = 0; j < x.top_logprobs.size(); ++j) {
      EXPECT_EQ(x.top_logprobs[j].token, y.top_logprobs[j].token) << label << " entry " << i;
      EXPECT_EQ(x.top_logprobs[j].logprob, y.top_logprobs[j].logprob) << label << " entry " << i;
    }
  }
  EXPECT_EQ(a.tokens, b.tokens) << label;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << label;
  for (size_t t = 0; t < a.logits.size(); ++t) EXPECT_EQ(a.logits[t], b.logits[t]) << label << " generated token " << t;
}

class PromptLogprobsFamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(PromptLogprobsFamilyTest, MatchReferenceInBothModesWithChunkedPrefill) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    const std::string label = GetParam().name + (mode == BatchingMode::kDepthWise ? " depth" : " sequence");
    ExpectWorkloadResults(weights, w, RunEngine(weights, Config(mode, 10), w.requests, w.arrivals), label);
  }
}

// One long prompt alone in one chunk, alone in chunks of 3, and in chunks inside a busy
// depth-wise batch (where MoR and early-exit neighbours run at other depths): bit-identical,
// generated tokens' logits included.
TEST_P(PromptLogprobsFamilyTest, AloneChunkedAndBusyAreBitIdentical) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  const GenerateRequest probe = Scored(testing::MakePrompts(1, 40, 40, vocab, 5)[0], 3, 6);
  const RunResult whole = RunEngine(weights, Config(BatchingMode::kDepthWise, 64), {probe}, {0})[0];
  ExpectMatchesReference(weights, probe, whole, GetParam().name + " alone");
  const RunResult chunked = RunEngine(weights, Config(BatchingMode::kDepthWise, 3), {probe}, {0})[0];
  Workload busy = MakeWorkload(vocab);
  busy.requests.push_back(probe);
  busy.arrivals.push_back(2);
  const RunResult mixed =
      RunEngine(weights, Config(BatchingMode::kDepthWise, 10), busy.requests, busy.arrivals).back();
  ExpectBitIdentical(whole, chunked, GetParam().name + " chunked");
  ExpectBitIdentical(whole, mixed, GetParam().name + " busy");
}

INSTANTIATE_TEST_SUITE_P(Families, PromptLogprobsFamilyTest, ::testing::ValuesIn(testing::EngineFamilies(testing::F32Spec)),
                         testing::FamilyCaseName);

std::shared_ptr<const ModelWeights> MorModel(testing::TempDir* dir) {
  return testing::MakeModel(testing::F32Spec("mor-ec"), dir);
}

// A prompt token scored here carries the logprob the same token had when it was generated
// after the same context (alignment: entry i scores prompt token i + 1).
TEST(PromptLogprobsTest, EqualGeneratedLogprobsOfTheSameTokens) {
  testing::TempDir dir;
  auto weights = MorModel(&dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<int> prompt = testing::MakePrompts(1, 7, 7, weights->config.vocab_size, 3)[0];
  GenerateRequest gen = testing::Greedy(prompt, 5);
  gen.params.logprobs = 3;
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise, 64));
  ASSERT_TRUE(engine.ok());
  auto ch = (*engine)->Submit(gen);
  ASSERT_TRUE(ch.ok());
  (*engine)->RunUntilIdle();
  std::vector<TokenEvent> generated;
  for (RequestEvent& e : (*ch)->DrainUntilFinal()) {
    for (TokenEvent& t : e.tokens) generated.push_back(std::move(t));
  }
  ASSERT_EQ(generated.size(), 5u);
  std::vector<int> extended = prompt;
  for (const TokenEvent& t : generated) extended.push_back(t.token);
  auto scored = (*engine)->Submit(Scored(extended, 0, 3));
  ASSERT_TRUE(scored.ok());
  (*engine)->RunUntilIdle();
  const RunResult got = testing::Collect(scored->get());
  ASSERT_TRUE(got.prompt_logprobs.has_value());
  ASSERT_EQ(got.prompt_logprobs->size(), extended.size() - 1);
  for (size_t t = 0; t < generated.size(); ++t) {
    const PromptTokenLogprob& e = (*got.prompt_logprobs)[prompt.size() - 1 + t];
    EXPECT_EQ(e.token, generated[t].token);
    EXPECT_NEAR(e.logprob, generated[t].logprob, 1e-5) << "token " << t;
    EXPECT_EQ(e.rank, 1) << "greedy tokens rank first";  // ties aside, which random fp32 logits lack
    ASSERT_EQ(e.top_logprobs.size(), generated[t].top_logprobs.size());
    for (size_t j = 0; j < e.top_logprobs.size(); ++j) {
      EXPECT_EQ(e.top_logprobs[j].token, generated[t].top_logprobs[j].token);
      EXPECT_NEAR(e.top_logprobs[j].logprob, generated[t].top_logprobs[j].logprob, 1e-5);
    }
  }
}

// max_tokens 0: scored, nothing generated, finished with "length"; a one-token prompt has no
// entry to score; a prompt may fill the whole context when nothing is generated.
TEST(PromptLogprobsTest, MaxTokensZeroScoresWithoutGenerating) {
  testing::TempDir dir;
  auto weights = MorModel(&dir);
  ASSERT_NE(weights, nullptr);
  const int context = weights->config.max_position_embeddings;
  const int vocab = weights->config.vocab_size;
  const std::vector<int> full = testing::MakePrompts(1, context, context, vocab, 8)[0];
  Workload w;
  w.requests = {Scored({5}, 0, 2), Scored({5, 9, 2}, 0, 0), Scored(full, 0, 1),
                testing::Greedy({1, 2, 3}, 4)};
  w.arrivals = {0, 0, 1, 0};
  const std::vector<RunResult> got = RunEngine(weights, Config(BatchingMode::kDepthWise, 48), w.requests, w.arrivals);
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(got[i].tokens.empty()) << i;
    EXPECT_EQ(got[i].finish, FinishReason::kLength) << i;
    EXPECT_EQ(got[i].usage.completion_tokens, 0) << i;
    EXPECT_EQ(got[i].usage.prompt_tokens, static_cast<int>(w.requests[i].prompt.size())) << i;
  }
  ASSERT_TRUE(got[0].prompt_logprobs.has_value());
  EXPECT_TRUE(got[0].prompt_logprobs->empty());
  ExpectMatchesReference(weights, w.requests[1], got[1], "three tokens");
  ExpectMatchesReference(weights, w.requests[2], got[2], "full context");
  EXPECT_EQ(got[3].tokens.size(), 4u);
  EXPECT_FALSE(got[3].prompt_logprobs.has_value());
}

// Preemption recomputes positions; the prompt logprobs still match and go out once.
TEST(PromptLogprobsTest, SurvivesPreemption) {
  testing::TempDir dir;
  auto weights = MorModel(&dir);
  ASSERT_NE(weights, nullptr);
  Workload w = MakeWorkload(weights->config.vocab_size);
  EngineConfig cfg = Config(BatchingMode::kDepthWise, 64);
  cfg.block_size = 2;
  cfg.num_kv_blocks = weights->plan.num_cache_slots * 20;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok());
  auto got = testing::RunStaggered(engine->get(), w.requests, std::vector<int>(w.requests.size(), 0));
  EXPECT_GT((*engine)->stats().preemptions, 0) << "the pool was meant to be too small";
  ExpectWorkloadResults(weights, w, got, "preempted");
}

TEST(PromptLogprobsTest, RejectsBadValuesNamingTheField) {
  testing::TempDir dir;
  auto weights = MorModel(&dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise, 64));
  ASSERT_TRUE(engine.ok());
  const int context = weights->config.max_position_embeddings;
  struct Case {
    GenerateRequest request;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<int> full(context, 3);
  std::vector<Case> cases = {
      {Scored({1, 2}, 1, 21), absl::StatusCode::kInvalidArgument, "prompt_logprobs"},
      {Scored({1, 2}, 1, -1), absl::StatusCode::kInvalidArgument, "prompt_logprobs"},
      {testing::Greedy({1, 2}, 0), absl::StatusCode::kInvalidArgument, "max_tokens"},
      {Scored({1, 2}, -1, 0), absl::StatusCode::kInvalidArgument, "max_tokens"},
      {Scored(full, 1, 0), absl::StatusCode::kFailedPrecondition, "prompt"},
      {Scored(std::vector<int>(context + 1, 3), 0, 0), absl::StatusCode::kFailedPrecondition, "prompt"},
  };
  for (const Case& c : cases) {
    auto r = (*engine)->Submit(c.request);
    ASSERT_FALSE(r.ok()) << c.field;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace morserve
