// RowSampler: a step's rows sampled at once over a thread pool give, row for row, what one
// Sampler gives each row alone (tokens, logprobs and top logprobs), whatever the number of
// threads and the order of the rows; and the sampler's scratch carries nothing between rows.
#include "engine/runtime/row_sampler.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/cpu/thread_pool.h"
#include "engine/runtime/sampler.h"

namespace morserve {
namespace {

struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int> prompt, output;
  uint64_t seed = 0;
};

// Rows of mixed settings: greedy, temperature with top-k / top-p / min-p, penalties and bias,
// alternatives asked for.
std::vector<Case> MakeCases(int n, int vocab) {
  std::mt19937_64 rng(17);
  std::normal_distribution<float> value(0.0f, 3.0f);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<Case> cases(n);
  for (int i = 0; i < n; ++i) {
    Case& c = cases[i];
    c.logits.resize(vocab);
    for (float& v : c.logits) v = value(rng);
    c.seed = rng();
    c.prompt = {id(rng), id(rng), id(rng)};
    for (int t = 0; t < i % 5; ++t) c.output.push_back(id(rng));
    SamplingParams& p = c.params;
    p.temperature = i % 4 == 0 ? 0.0f : 0.5f + 0.1f * (i % 7);
    p.top_k = i % 3 == 1 ? 40 : 0;
    p.top_p = i % 5 == 2 ? 0.8f : 1.0f;
    p.min_p = i % 6 == 3 ? 0.05f : 0.0f;
    p.repetition_penalty = i % 4 == 1 ? 1.3f : 1.0f;
    p.frequency_penalty = i % 8 == 5 ? 0.5f : 0.0f;
    if (i % 9 == 4) p.logit_bias = {{id(rng), 5.0f}};
    p.logprobs = i % 3 == 2 ? 5 : 0;
  }
  return cases;
}

std::vector<SampleInput> Inputs(const std::vector<Case>& cases) {
  std::vector<SampleInput> in(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    in[i].logits = cases[i].logits;
    in[i].params = &cases[i].params;
    in[i].prompt_ids = cases[i].prompt;
    in[i].output_ids = cases[i].output;
    in[i].seed = cases[i].seed;
  }
  return in;
}

void ExpectSame(const SampleResult& got, const SampleResult& want, size_t row) {
  EXPECT_EQ(got.token, want.token) << "row " << row;
  EXPECT_EQ(got.logprob, want.logprob) << "row " << row;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << "row " << row;
  for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
    EXPECT_EQ(got.top_logprobs[j].token, want.top_logprobs[j].token) << "row " << row;
    EXPECT_EQ(got.top_logprobs[j].logprob, want.top_logprobs[j].logprob) << "row " << row;
  }
}

TEST(RowSamplerTest, EachRowAsSampledAloneForAnyThreadCount) {
  const std::vector<Case> cases = MakeCases(37, 3001);
  const std::vector<SampleInput> in = Inputs(cases);
  std::vector<SampleResult> want;
  for (const SampleInput& x : in) want.push_back(Sampler().Sample(x));
  int sampled = 0;
  for (const SampleResult& w : want) sampled += w.token >= 0;
  ASSERT_EQ(sampled, 37);
  for (int threads : {1, 3, 8}) {
    ThreadPool pool(threads);
    RowSampler rows(&pool);
    for (int round = 0; round < 2; ++round) {  // samplers reused: no state carried over
      std::vector<SampleResult> got;
      rows.SampleRows(in, &got);
      ASSERT_EQ(got.size(), want.size());
      for (size_t r = 0; r < want.size(); ++r) ExpectSame(got[r], want[r], r);
    }
    // Reversed row order: the same per-row results.
    std::vector<SampleInput> reversed(in.rbegin(), in.rend());
    std::vector<SampleResult> got;
    rows.SampleRows(reversed, &got);
    for (size_t r = 0; r < want.size(); ++r) ExpectSame(got[want.size() - 1 - r], want[r], r);
  }
}

TEST(RowSamplerTest, NoRowsAndOneRow) {
  ThreadPool pool(2);
  RowSampler rows(&pool);
  std::vector<SampleResult> got(3);
  rows.SampleRows({}, &got);
  EXPECT_TRUE(got.empty());
  const std::vector<Case> cases = MakeCases(1, 500);
  const std::vector<SampleInput> in = Inputs(cases);
  rows.SampleRows(in, &got);
  ASSERT_EQ(got.size(), 1u);
  ExpectSame(got[0], Sampler().Sample(in[0]), 0);
}

}  // namespace
}  // namespace morserve
