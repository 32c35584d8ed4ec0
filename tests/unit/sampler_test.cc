// Sampler: values, not "no crash". Greedy and its equivalents (top_k = 1, tiny top_p), the
// exact penalty formulas on hand-made logits, top_p / min_p kept sets, seeded
// reproducibility independent of interleaving, empirical frequencies against softmax
// (chi-square bound; fixed seeds so the test cannot flake), raw logprobs against a double
// log_softmax, and agreement with a plain full-sort reference on random inputs.
#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace morserve {
namespace {

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = dist(gen);
  return logits;
}

SampleInput Input(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed,
                  absl::Span<const int> output = {}, absl::Span<const int> prompt = {}) {
  SampleInput in;
  in.logits = logits;
  in.params = &p;
  in.prompt_ids = prompt;
  in.output_ids = output;
  in.seed = seed;
  return in;
}

int ArgmaxLowestId(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

std::vector<double> LogSoftmaxDouble(const std::vector<float>& x) {
  double m = -std::numeric_limits<double>::infinity();
  for (float v : x) m = std::max(m, static_cast<double>(v));
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - m);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(sum);
  return out;
}

TEST(SamplerTest, GreedyPicksArgmaxWithTiesToLowestId) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(sampler.Sample(Input(logits, p, 1)).token, 1);
  for (uint32_t s = 0; s < 20; ++s) {
    const std::vector<float> row = RandomLogits(5000, s);
    EXPECT_EQ(sampler.Sample(Input(row, p, s)).token, ArgmaxLowestId(row));
  }
}

TEST(SamplerTest, GreedyIgnoresFiltersButAppliesPenalties) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 3;
  p.top_p = 0.1f;
  p.min_p = 0.9f;
  const std::vector<float> logits = {3.0f, 2.5f, 0.0f};
  EXPECT_EQ(sampler.Sample(Input(logits, p, 7)).token, 0);
  p.repetition_penalty = 2.0f;  // 3.0 -> 1.5 < 2.5
  const std::vector<int> prompt = {0};
  EXPECT_EQ(sampler.Sample(Input(logits, p, 7, {}, prompt)).token, 1);
}

TEST(SamplerTest, PenaltiesFollowTheExactFormulas) {
  Sampler sampler;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, 0.0f};
  const std::vector<int> prompt = {0, 1, 6};
  const std::vector<int> output = {2, 2, 4, 1};
  const absl::Span<const float> got = sampler.ProcessLogits(Input(logits, p, 0, output, prompt));
  // id: prompt/output count -> repetition (divide positive, multiply non-positive), then frequency
  // * count and presence on output tokens only.
  const std::vector<float> want = {
      2.0f / 2.0f,                      // prompt only
      -1.0f * 2.0f - 0.5f * 1 - 0.25f,  // prompt and output once
      0.5f / 2.0f - 0.5f * 2 - 0.25f,   // output twice
      3.0f,                             // untouched
      -2.0f * 2.0f - 0.5f * 1 - 0.25f,  // output once
      0.0f,                             // untouched
      0.0f,                             // prompt, zero logit stays zero
  };
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "id " << i;

  // Scratch state is reset: the same call with no history leaves the logits unchanged.
  const absl::Span<const float> clean = sampler.ProcessLogits(Input(logits, p, 0));
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_EQ(clean[i], logits[i]) << "id " << i;

  // Repetition penalty < 1 rewards: positive logits grow, negative shrink toward zero.
  SamplingParams reward;
  reward.repetition_penalty = 0.5f;
  const std::vector<int> both = {0, 1};
  const absl::Span<const float> r = sampler.ProcessLogits(Input(logits, reward, 0, {}, both));
  EXPECT_FLOAT_EQ(r[0], 4.0f);
  EXPECT_FLOAT_EQ(r[1], -0.5f);
}

TEST(SamplerTest, PresenceAndFrequencyIgnorePromptTokens) {
  Sampler sampler;
  SamplingParams p;
  p.frequency_penalty = 1.0f;
  p.presence_penalty = 1.0f;
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f};
  const std::vector<int> prompt = {0, 0, 1};
  const std::vector<int> output = {1};
  const absl::Span<const float> got = sampler.ProcessLogits(Input(logits, p, 0, output, prompt));
  EXPECT_FLOAT_EQ(got[0], 1.0f);
  EXPECT_FLOAT_EQ(got[1], -1.0f);
  EXPECT_FLOAT_EQ(got[2], 1.0f);
}

TEST(SamplerTest, TopKOneAndTinyTopPEqualGreedyAtAnyTemperature) {
  Sampler sampler;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (float t : {0.05f, 0.7f, 1.0f, 3.0f, 100.0f}) {
    for (uint32_t s = 0; s < 30; ++s) {
      std::vector<float> row = RandomLogits(3000, 100 + s);
      if (s % 3 == 0) row[2999] = row[17] = *std::max_element(row.begin(), row.end()) + 1;
      const int want = sampler.Sample(Input(row, greedy, s)).token;
      SamplingParams k1;
      k1.temperature = t;
      k1.top_k = 1;
      SamplingParams tiny_p;
      tiny_p.temperature = t;
      tiny_p.top_p = 1e-7f;
      for (uint64_t seed = 0; seed < 5; ++seed) {
        EXPECT_EQ(sampler.Sample(Input(row, k1, seed)).token, want) << "t=" << t;
        EXPECT_EQ(sampler.Sample(Input(row, tiny_p, seed)).token, want) << "t=" << t;
      }
    }
  }
}

// Counts over seeds 0..n-1 at step 0.
std::vector<int> Histogram(const std::vector<float>& logits, const SamplingParams& p, int n) {
  Sampler sampler;
  std::vector<int> counts(logits.size(), 0);
  for (int s = 0; s < n; ++s) ++counts[sampler.Sample(Input(logits, p, s)).token];
  return counts;
}

// Pearson chi-square of counts against expected probabilities (zero-probability ids must
// have zero counts).
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs) {
  double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "id " << i << " has probability 0";
      continue;
    }
    const double e = n * probs[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<double> SoftmaxDouble(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Chi-square critical values at p = 0.001: df 7 -> 24.3, df 2 -> 13.8, df 1 -> 10.8.
TEST(SamplerTest, FrequenciesOverSeedsMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
  SamplingParams p;
  p.temperature = 0.8f;
  const std::vector<int> counts = Histogram(logits, p, 40000);
  EXPECT_LT(ChiSquare(counts, SoftmaxDouble(logits, 0.8)), 24.3);
}

TEST(SamplerTest, FrequenciesOverStepsMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
  SamplingParams p;
  const int n = 40000;
  const std::vector<int> history(n, 0);
  Sampler sampler;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) {
    const absl::Span<const int> output = absl::MakeConstSpan(history).first(i);
    ++counts[sampler.Sample(Input(logits, p, 12345, output)).token];
  }
  EXPECT_LT(ChiSquare(counts, SoftmaxDouble(logits, 1.0)), 24.3);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at ids 2, 0, 3, 1.
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f),
                                     std::log(0.15f)};
  SamplingParams p;
  p.top_p = 0.7f;  // mass above id 0 is 0.5 < 0.7: kept; above id 3 is 0.8: dropped
  EXPECT_LT(ChiSquare(Histogram(logits, p, 30000), {0.3 / 0.8, 0, 0.5 / 0.8, 0}), 10.8);
  p.top_p = 0.85f;
  EXPECT_LT(ChiSquare(Histogram(logits, p, 30000), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}), 13.8);
}

TEST(SamplerTest, TopKRenormalisesOverTheKBest) {
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f),
                                     std::log(0.15f)};
  SamplingParams p;
  p.top_k = 3;
  EXPECT_LT(ChiSquare(Histogram(logits, p, 30000), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}), 13.8);
}

TEST(SamplerTest, MinPDropsTokensBelowTheScaledMaximum) {
  const std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f),
                                     std::log(0.15f)};
  SamplingParams p;
  p.min_p = 0.5f;  // threshold 0.25: keeps 0.5 and 0.3
  EXPECT_LT(ChiSquare(Histogram(logits, p, 30000), {0.3 / 0.8, 0, 0.5 / 0.8, 0}), 10.8);
  p.min_p = 0.2f;  // threshold 0.1: keeps 0.5, 0.3 and 0.15
  EXPECT_LT(ChiSquare(Histogram(logits, p, 30000), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}), 13.8);
}

TEST(SamplerTest, NegativeInfinityIsNeverSampled) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {ninf, 0.0f, ninf, 0.0f, ninf};
  SamplingParams p;
  p.temperature = 5.0f;
  const std::vector<int> counts = Histogram(logits, p, 4000);
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  EXPECT_LT(ChiSquare(counts, {0, 0.5, 0, 0.5, 0}), 10.8);
}

TEST(SamplerTest, SeededSamplingIsReproducibleAndIndependentOfInterleaving) {
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_p = 0.95f;
  p.logprobs = 3;
  const int steps = 50;
  auto run_alone = [&](uint64_t seed, uint32_t logit_seed) {
    Sampler sampler;
    std::vector<int> out;
    std::vector<SampleResult> results;
    for (int i = 0; i < steps; ++i) {
      const std::vector<float> row = RandomLogits(1000, logit_seed + i);
      results.push_back(sampler.Sample(Input(row, p, seed, out)));
      out.push_back(results.back().token);
    }
    return results;
  };
  const std::vector<SampleResult> a = run_alone(42, 0);
  const std::vector<SampleResult> b = run_alone(43, 500);

  // Interleave both requests, plus unseeded noise requests, through one shared sampler.
  Sampler shared;
  std::vector<int> out_a, out_b;
  std::mt19937_64 noise(9);
  for (int i = 0; i < steps; ++i) {
    const std::vector<float> row_b = RandomLogits(1000, 500 + i);
    const SampleResult rb = shared.Sample(Input(row_b, p, 43, out_b));
    const std::vector<float> junk = RandomLogits(1000, 9999 + i);
    shared.Sample(Input(junk, p, noise()));
    const std::vector<float> row_a = RandomLogits(1000, i);
    const SampleResult ra = shared.Sample(Input(row_a, p, 42, out_a));
    EXPECT_EQ(ra.token, a[i].token) << "step " << i;
    EXPECT_EQ(rb.token, b[i].token) << "step " << i;
    // Bit for bit, logprobs included.
    EXPECT_EQ(ra.logprob, a[i].logprob);
    ASSERT_EQ(ra.top_logprobs.size(), 3u);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(ra.top_logprobs[j].token, a[i].top_logprobs[j].token);
      EXPECT_EQ(ra.top_logprobs[j].logprob, a[i].top_logprobs[j].logprob);
    }
    out_a.push_back(ra.token);
    out_b.push_back(rb.token);
  }
  // Different seeds give different streams.
  const std::vector<SampleResult> c = run_alone(44, 0);
  int same = 0;
  for (int i = 0; i < steps; ++i) same += c[i].token == a[i].token;
  EXPECT_LT(same, steps);
}

TEST(SamplerTest, UniformDependsOnlyOnSeedAndStep) {
  EXPECT_EQ(UniformForStep(1, 2), UniformForStep(1, 2));
  EXPECT_NE(UniformForStep(1, 2), UniformForStep(1, 3));
  EXPECT_NE(UniformForStep(1, 2), UniformForStep(2, 2));
  EXPECT_NE(UniformForStep(1, 2), UniformForStep(2, 1));
  double sum = 0.0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = UniformForStep(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  SamplingParams seeded;
  seeded.seed = 99;
  EXPECT_EQ(ResolveSeed(seeded), 99u);
  EXPECT_NE(DrawRandomSeed(),
            DrawRandomSeed());  // 2^-64 chance of a false failure
}

TEST(SamplerTest, LogprobsAreRawLogSoftmax) {
  Sampler sampler;
  const std::vector<float> logits = RandomLogits(32000, 3, 4.0f);
  const std::vector<double> want = LogSoftmaxDouble(logits);
  std::vector<int> ranked(logits.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int a, int b) { return logits[a] > logits[b]; });
  SamplingParams p;
  p.logprobs = kMaxLogprobs;
  p.temperature = 0.5f;  // processing changes the sampling distribution, not the logprobs
  p.repetition_penalty = 1.5f;
  p.top_k = 50;
  const std::vector<int> prompt = {ranked[0], ranked[5]};
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const SampleResult r = sampler.Sample(Input(logits, p, seed, {}, prompt));
    EXPECT_NEAR(r.logprob, want[r.token], 1e-5);
    ASSERT_EQ(r.top_logprobs.size(), static_cast<size_t>(kMaxLogprobs));
    for (int j = 0; j < kMaxLogprobs; ++j) {
      EXPECT_EQ(r.top_logprobs[j].token, ranked[j]) << j;
      EXPECT_NEAR(r.top_logprobs[j].logprob, want[ranked[j]], 1e-5) << j;
    }
  }
  p.logprobs = 0;
  EXPECT_TRUE(sampler.Sample(Input(logits, p, 0)).top_logprobs.empty());
}

TEST(SamplerTest, TopLogprobsBreakTiesByLowestId) {
  Sampler sampler;
  SamplingParams p;
  p.logprobs = 3;
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 1.0f, 1.0f};
  const SampleResult r = sampler.Sample(Input(logits, p, 0));
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);
  EXPECT_EQ(r.top_logprobs[1].token, 3);
  EXPECT_EQ(r.top_logprobs[2].token, 4);
}

// A plain implementation of the documented pipeline: full sort, double arithmetic.
int ReferenceSample(const std::vector<float>& logits, const SamplingParams& p, double u) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<float> x(vocab);
  for (int i = 0; i < vocab; ++i) x[i] = logits[i] / p.temperature;
  std::vector<int> keep(vocab);
  std::iota(keep.begin(), keep.end(), 0);
  std::stable_sort(keep.begin(), keep.end(), [&](int a, int b) { return x[a] > x[b]; });
  if (p.top_k > 0 && p.top_k < vocab) keep.resize(p.top_k);
  std::vector<double> w(vocab, 0.0);
  for (int id : keep) w[id] = std::exp(static_cast<double>(x[id]) - x[keep[0]]);
  if (p.top_p < 1.0f) {
    double total = 0.0;
    for (int id : keep) total += w[id];
    double before = 0.0;
    size_t n = 0;
    while (n < keep.size() && before < p.top_p * total) before += w[keep[n++]];
    keep.resize(n);
  }
  if (p.min_p > 0.0f) {
    const double threshold = p.min_p * w[keep[0]];
    std::erase_if(keep, [&](int id) { return w[id] < threshold; });
  }
  std::sort(keep.begin(), keep.end());
  double total = 0.0;
  for (int id : keep) total += w[id];
  double acc = 0.0;
  for (int id : keep) {
    acc += w[id];
    if (acc > u * total) return id;
  }
  return keep.back();
}

TEST(SamplerTest, AgreesWithAFullSortReference) {
  Sampler sampler;
  std::mt19937 gen(2024);
  const float temps[] = {0.3f, 1.0f, 2.0f};
  const int top_ks[] = {0, -1, 1, 5, 40, 999};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.1f};
  const float min_ps[] = {0.0f, 0.05f, 0.3f};
  int mismatches = 0;
  int trials = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int vocab = trial % 100 == 0 ? 128000 : 3000;  // > 1024: top_p probe runs
    const std::vector<float> row = RandomLogits(vocab, trial, trial % 2 ? 1.0f : 4.0f);
    SamplingParams p;
    p.temperature = temps[gen() % 3];
    p.top_k = top_ks[gen() % 6];
    p.top_p = top_ps[gen() % 4];
    p.min_p = min_ps[gen() % 3];
    const uint64_t seed = gen();
    const int got = sampler.Sample(Input(row, p, seed)).token;
    mismatches += got != ReferenceSample(row, p, UniformForStep(seed, 0));
    ++trials;
  }
  EXPECT_EQ(mismatches, 0) << "of " << trials;
}

}  // namespace
}  // namespace morserve
