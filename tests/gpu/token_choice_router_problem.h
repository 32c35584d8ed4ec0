// Token-choice router problems for the kernel tests (kernel_token_choice_router_test on the
// GPU, kernel_token_choice_router_emu_test on the CPU emulator) and their checks against the
// executor's rule (ModelExecutor::EntryRouting):
//   - given scores (planted exact ties, optional bias, softmax or sigmoid): depths exact (ties
//     to the lowest index, bias applied), gates to 1e-6 relative;
//   - the linear router computed in the kernel (fp32 h, fp32 or bf16 weights): scores to 1e-4
//     of the double dot product, exact depths (rows whose best and second-best probabilities
//     lie within 1e-4 are redrawn, so that is a fair demand of fp32 scores), gates to 1e-4.
// Params() fills everything but the pointers, which each variant sets to its own memory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/token_choice_router.cuh"
#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

using kernels::TokenChoiceActivation;
using kernels::TokenChoiceRouterParams;

struct TokenChoiceOutputs {
  std::vector<int32_t> depth;
  std::vector<float> gate, scores;
};

// The executor's probabilities for one row of scores.
inline std::vector<double> TokenChoiceProbs(const float* s, int nr, float alpha,
                                            TokenChoiceActivation act) {
  std::vector<double> p(nr);
  if (act == TokenChoiceActivation::kSigmoid) {
    for (int j = 0; j < nr; ++j)
      p[j] = alpha * (1.0 / (1.0 + std::exp(-static_cast<double>(s[j]))));
  } else {
    const double m = *std::max_element(s, s + nr);
    double sum = 0;
    for (int j = 0; j < nr; ++j) sum += std::exp(s[j] - m);
    for (int j = 0; j < nr; ++j) p[j] = alpha * std::exp(s[j] - m) / sum;
  }
  return p;
}

// The executor's choice: the largest biased probability, the lowest index on ties.
inline int TokenChoiceBest(const std::vector<double>& p, const std::vector<float>& bias) {
  int best = 0;
  for (int j = 1; j < static_cast<int>(p.size()); ++j) {
    if (p[j] + (bias.empty() ? 0.0 : bias[j]) > p[best] + (bias.empty() ? 0.0 : bias[best]))
      best = j;
  }
  return best;
}

struct TokenChoiceGivenProblem {
  int rows = 0, nr = 4;
  float alpha = 0.9f;
  TokenChoiceActivation act = TokenChoiceActivation::kSoftmax;
  std::vector<float> scores, bias;  // [rows, nr]; bias empty or [nr]

  static TokenChoiceGivenProblem Make(uint64_t seed, TokenChoiceActivation act, bool with_bias,
                                      int rows) {
    TokenChoiceGivenProblem p;
    p.rows = rows;
    p.act = act;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    p.scores.resize(static_cast<size_t>(rows) * p.nr);
    for (float& s : p.scores) s = dist(rng);
    // Exact ties: equal scores give equal probabilities, so the lowest index must win.
    for (int j = 0; j < p.nr; ++j) p.scores[j] = 0.5f;
    p.scores[p.nr + 1] = p.scores[p.nr + 3] = 3.0f;
    p.scores[p.nr + 0] = p.scores[p.nr + 2] = -1.0f;
    if (with_bias) p.bias = {0.0f, -0.05f, 0.1f, 0.02f};
    return p;
  }

  TokenChoiceRouterParams Params() const {
    TokenChoiceRouterParams p;
    p.rows = rows;
    p.num_recursions = nr;
    p.alpha = alpha;
    p.activation = act;
    return p;
  }

  void Check(const TokenChoiceOutputs& out) const {
    for (int r = 0; r < rows; ++r) {
      const std::vector<double> prob =
          TokenChoiceProbs(&scores[static_cast<size_t>(r) * nr], nr, alpha, act);
      const int best = TokenChoiceBest(prob, bias);
      ASSERT_EQ(out.depth[r], best + 1) << "row " << r;
      ASSERT_NEAR(out.gate[r], prob[best], 1e-6 * prob[best]) << "row " << r;
    }
    if (bias.empty()) {
      EXPECT_EQ(out.depth[0], 1);  // four-way tie
      EXPECT_EQ(out.depth[1], 2);  // tie between 2 and 4
    }
  }
};

struct TokenChoiceLinearProblem {
  int rows = 0, hidden = 0, nr = 0;
  float alpha = 1.0f;
  std::vector<float> h;  // [rows, hidden]
  HostTensor w;          // [nr, hidden]
  std::vector<std::vector<double>> ref_scores;

  static TokenChoiceLinearProblem Make(uint64_t seed, DType w_t, int rows, int hidden, int nr) {
    TokenChoiceLinearProblem p;
    p.rows = rows;
    p.hidden = hidden;
    p.nr = nr;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(nr) * hidden);
    for (float& v : w) v = dist(rng) * 0.05f;
    p.w = HostTensor::Of(w_t, std::move(w));
    p.h.resize(static_cast<size_t>(rows) * hidden);
    p.ref_scores.resize(rows);
    for (int r = 0; r < rows; ++r) {
      float* x = &p.h[static_cast<size_t>(r) * hidden];
      for (;;) {
        for (int i = 0; i < hidden; ++i) x[i] = dist(rng);
        if (p.DrawScores(r)) break;  // a clear winner
      }
    }
    return p;
  }

  TokenChoiceRouterParams Params() const {
    TokenChoiceRouterParams p;
    p.w_dtype = w.dtype;
    p.rows = rows;
    p.hidden = hidden;
    p.num_recursions = nr;
    p.alpha = alpha;
    return p;
  }

  std::vector<float> FloatScores(int r) const {
    std::vector<float> s(nr);
    for (int j = 0; j < nr; ++j) s[j] = static_cast<float>(ref_scores[r][j]);
    return s;
  }

  void Check(const TokenChoiceOutputs& out) const {
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < nr; ++j) {
        ASSERT_NEAR(out.scores[static_cast<size_t>(r) * nr + j], ref_scores[r][j], 1e-4)
            << "row " << r << " score " << j;
      }
      const std::vector<float> s = FloatScores(r);
      const std::vector<double> prob =
          TokenChoiceProbs(s.data(), nr, alpha, TokenChoiceActivation::kSoftmax);
      const int best = TokenChoiceBest(prob, {});
      ASSERT_EQ(out.depth[r], best + 1) << "row " << r;
      ASSERT_NEAR(out.gate[r], prob[best], 1e-4) << "row " << r;
    }
  }

 private:
  // Row r's reference scores; false when its best two probabilities lie within 1e-4.
  bool DrawScores(int r) {
    const float* x = &h[static_cast<size_t>(r) * hidden];
    ref_scores[r].assign(nr, 0.0);
    for (int j = 0; j < nr; ++j) {
      for (int i = 0; i < hidden; ++i)
        ref_scores[r][j] += static_cast<double>(x[i]) * w.values[j * hidden + i];
    }
    const std::vector<float> s = FloatScores(r);
    std::vector<double> prob =
        TokenChoiceProbs(s.data(), nr, alpha, TokenChoiceActivation::kSoftmax);
    std::sort(prob.begin(), prob.end());
    return nr == 1 || prob[nr - 1] - prob[nr - 2] > 1e-4;
  }
};

}  // namespace morserve::testing
