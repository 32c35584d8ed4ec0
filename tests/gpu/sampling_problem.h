// A device-sampling problem for the kernel tests (kernel_sampling_test on the GPU,
// kernel_sampling_emu_test on the CPU emulator): rows of random logits, continuous or heavily
// tied (rounded to halves, some -inf), each with its own sampling parameters drawn from
// greedy, temperature, top_k, top_p, min_p and their combinations, a seed and an RNG step;
// and the exact check of the sampled tokens against the engine's CPU Sampler (the step taken
// from the output history length, as the sampler does).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"

namespace morserve::testing {

struct SamplingRowSpec {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  uint64_t step;
};

// The per-row parameter arrays of a launch, in the kernels' layout.
struct SamplingColumns {
  std::vector<float> temperature, top_p, min_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seed, step;
};

struct SamplingProblem {
  int vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<SamplingRowSpec> rows;

  static SamplingProblem Make(uint64_t seed, int vocab, bool tied, int n) {
    SamplingProblem p;
    p.vocab = vocab;
    std::mt19937_64 rng(seed);
    const float temps[] = {0.0f, 0.5f, 1.0f, 1.5f};
    const int ks[] = {0, 1, 2, 20, 50, vocab, -1};
    const float tps[] = {1.0f, 0.95f, 0.8f, 0.3f};
    const float mps[] = {0.0f, 0.0f, 0.05f, 0.3f};
    std::normal_distribution<float> dist(0.0f, 2.5f);
    std::uniform_int_distribution<int> pick(0, 1 << 30);
    for (int r = 0; r < n; ++r) {
      SamplingRowSpec s;
      s.temperature = temps[pick(rng) % 4];
      s.top_k = ks[pick(rng) % 7];
      s.top_p = tps[pick(rng) % 4];
      s.min_p = mps[pick(rng) % 4];
      s.seed = (static_cast<uint64_t>(pick(rng)) << 32) ^ pick(rng);
      s.step = pick(rng) % 300;
      p.rows.push_back(s);
      for (int i = 0; i < vocab; ++i) {
        float x = dist(rng);
        if (tied) {
          x = std::round(x * 2.0f) / 2.0f;  // many equal logits
          if (i % 97 == 5) x = -std::numeric_limits<float>::infinity();
        }
        p.logits.push_back(x);
      }
    }
    return p;
  }

  static std::string Describe(int vocab, bool tied, uint64_t seed) {
    return "vocab=" + std::to_string(vocab) + (tied ? " tied" : "") +
           " seed=" + std::to_string(seed);
  }

  int num_rows() const { return static_cast<int>(rows.size()); }
  const float* Row(int r) const { return logits.data() + static_cast<size_t>(r) * vocab; }

  SamplingColumns Columns(int first, int count) const {
    SamplingColumns c;
    for (int r = first; r < first + count; ++r) {
      c.temperature.push_back(rows[r].temperature);
      c.top_k.push_back(rows[r].top_k);
      c.top_p.push_back(rows[r].top_p);
      c.min_p.push_back(rows[r].min_p);
      c.seed.push_back(rows[r].seed);
      c.step.push_back(rows[r].step);
    }
    return c;
  }

  // The CPU sampler's token for row r.
  int CpuToken(int r, Sampler& sampler) const {
    const SamplingRowSpec& s = rows[r];
    morserve::SamplingParams params;
    params.temperature = s.temperature;
    params.top_k = s.top_k;
    params.top_p = s.top_p;
    params.min_p = s.min_p;
    std::vector<int> history(s.step, 0);  // its length is the RNG step; no penalties
    SampleInput in;
    in.logits = absl::MakeConstSpan(Row(r), vocab);
    in.params = &params;
    in.output_ids = history;
    in.seed = s.seed;
    return sampler.Sample(in).token;
  }

  // got: the tokens of all rows, launched together.
  void Check(const std::vector<int32_t>& got) const {
    ASSERT_EQ(got.size(), rows.size());
    Sampler sampler;
    for (int r = 0; r < num_rows(); ++r) {
      const SamplingRowSpec& s = rows[r];
      ASSERT_EQ(got[r], CpuToken(r, sampler))
          << "row " << r << ": temperature " << s.temperature << " top_k " << s.top_k << " top_p "
          << s.top_p << " min_p " << s.min_p << " seed " << s.seed << " step " << s.step;
    }
  }
};

}  // namespace morserve::testing
