// token_choice_router_forward against the executor's rule (ModelExecutor::EntryRouting) on
// fresh random inputs with poisoned outputs: depths exact (ties to the lowest index, bias
// applied), gates to 1e-6 relative with given scores; with the linear router computed in
// the kernel, rows whose best and second-best biased probabilities lie within 1e-4 are
// redrawn so the exact depth is a fair demand of fp32 scores. Batch invariance is bitwise.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/token_choice_router.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

// The executor's probabilities for one row of scores.
std::vector<double> Probs(const float* s, int nr, float alpha, TokenChoiceActivation act) {
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

int Best(const std::vector<double>& p, const std::vector<float>& bias) {
  int best = 0;
  for (int j = 1; j < static_cast<int>(p.size()); ++j) {
    if (p[j] + (bias.empty() ? 0.0 : bias[j]) > p[best] + (bias.empty() ? 0.0 : bias[best]))
      best = j;
  }
  return best;
}

struct Outputs {
  std::vector<int32_t> depth;
  std::vector<float> gate, scores;
};

void Launch(TokenChoiceRouterParams p, Outputs* out) {
  DeviceBuffer<int32_t> depth(p.rows);
  DeviceBuffer<float> gate(p.rows), scores(static_cast<size_t>(p.rows) * p.num_recursions);
  ASSERT_TRUE(depth.ok() && gate.ok() && scores.ok());
  MORSERVE_CUDA_OK(depth.Poison());
  MORSERVE_CUDA_OK(gate.Poison());
  MORSERVE_CUDA_OK(scores.Poison());
  p.depth = depth.get();
  p.gate = gate.get();
  p.scores_out = scores.get();
  MORSERVE_CUDA_OK(token_choice_router_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(depth.Download(&out->depth));
  MORSERVE_CUDA_OK(gate.Download(&out->gate));
  MORSERVE_CUDA_OK(scores.Download(&out->scores));
}

class TokenChoiceRouterTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(TokenChoiceRouterTest, GivenScoresDecideExactly) {
  for (auto act : {TokenChoiceActivation::kSoftmax, TokenChoiceActivation::kSigmoid}) {
    for (bool with_bias : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int rows = 200, nr = 4;
      const float alpha = 0.9f;
      std::normal_distribution<float> dist(0.0f, 1.5f);
      std::vector<float> scores(static_cast<size_t>(rows) * nr), bias;
      for (float& s : scores) s = dist(rng);
      // Exact ties: equal scores give equal probabilities, so the lowest index must win.
      for (int j = 0; j < nr; ++j) scores[j] = 0.5f;
      scores[nr + 1] = scores[nr + 3] = 3.0f;
      scores[nr + 0] = scores[nr + 2] = -1.0f;
      if (with_bias) bias = {0.0f, -0.05f, 0.1f, 0.02f};
      DeviceBuffer<float> dscores(scores.size()), dbias(nr);
      ASSERT_TRUE(dscores.ok() && dbias.ok());
      MORSERVE_CUDA_OK(dscores.Upload(scores));
      if (with_bias) MORSERVE_CUDA_OK(dbias.Upload(bias));
      TokenChoiceRouterParams p;
      p.scores_in = dscores.get();
      p.bias = with_bias ? dbias.get() : nullptr;
      p.rows = rows;
      p.num_recursions = nr;
      p.alpha = alpha;
      p.activation = act;
      Outputs out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
      for (int r = 0; r < rows; ++r) {
        const std::vector<double> prob =
            Probs(&scores[static_cast<size_t>(r) * nr], nr, alpha, act);
        const int best = Best(prob, bias);
        ASSERT_EQ(out.depth[r], best + 1) << "row " << r;
        ASSERT_NEAR(out.gate[r], prob[best], 1e-6 * prob[best]) << "row " << r;
      }
      if (!with_bias) {
        EXPECT_EQ(out.depth[0], 1);  // four-way tie
        EXPECT_EQ(out.depth[1], 2);  // tie between 2 and 4
      }
    }
  }
}

TEST_F(TokenChoiceRouterTest, LinearRouterMatchesReferenceAndIsBatchInvariant) {
  for (DType w_t : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(std::string(w_t == DType::kBF16 ? "w=bf16" : "w=f32") +
                 " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int rows = 48, hidden = 576, nr = 3;
    const float alpha = 1.0f;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(nr) * hidden);
    std::vector<uint16_t> w_bits;
    for (float& v : w) {
      v = dist(rng) * 0.05f;
      if (w_t == DType::kBF16) {
        w_bits.push_back(F32ToBf16(v));
        v = Bf16ToF32(w_bits.back());
      }
    }
    std::vector<float> h(static_cast<size_t>(rows) * hidden);
    std::vector<std::vector<double>> ref_scores(rows);
    for (int r = 0; r < rows; ++r) {
      float* x = &h[static_cast<size_t>(r) * hidden];
      for (;;) {
        for (int i = 0; i < hidden; ++i) x[i] = dist(rng);
        std::vector<float> s(nr);
        ref_scores[r].assign(nr, 0.0);
        for (int j = 0; j < nr; ++j) {
          for (int i = 0; i < hidden; ++i)
            ref_scores[r][j] += static_cast<double>(x[i]) * w[j * hidden + i];
          s[j] = static_cast<float>(ref_scores[r][j]);
        }
        std::vector<double> prob = Probs(s.data(), nr, alpha, TokenChoiceActivation::kSoftmax);
        std::sort(prob.begin(), prob.end());
        if (prob[nr - 1] - prob[nr - 2] > 1e-4) break;  // a clear winner
      }
    }
    const size_t w_bytes = w.size() * (w_t == DType::kBF16 ? 2 : 4);
    DeviceBuffer<float> dh(h.size());
    DeviceBuffer<uint8_t> dw(w_bytes);
    ASSERT_TRUE(dh.ok() && dw.ok());
    MORSERVE_CUDA_OK(dh.Upload(h));
    const void* hw = w_t == DType::kBF16 ? static_cast<const void*>(w_bits.data()) : w.data();
    MORSERVE_CUDA_OK(cudaMemcpy(dw.get(), hw, w_bytes, cudaMemcpyHostToDevice));
    TokenChoiceRouterParams p;
    p.h = dh.get();
    p.router_w = dw.get();
    p.w_dtype = w_t;
    p.rows = rows;
    p.hidden = hidden;
    p.num_recursions = nr;
    p.alpha = alpha;
    Outputs out;
    ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
    for (int r = 0; r < rows; ++r) {
      std::vector<float> s(nr);
      for (int j = 0; j < nr; ++j) {
        s[j] = static_cast<float>(ref_scores[r][j]);
        ASSERT_NEAR(out.scores[static_cast<size_t>(r) * nr + j], ref_scores[r][j], 1e-4)
            << "row " << r << " score " << j;
      }
      const std::vector<double> prob = Probs(s.data(), nr, alpha, TokenChoiceActivation::kSoftmax);
      const int best = Best(prob, {});
      ASSERT_EQ(out.depth[r], best + 1) << "row " << r;
      ASSERT_NEAR(out.gate[r], prob[best], 1e-4) << "row " << r;
    }
    for (int r = 0; r < rows; ++r) {
      TokenChoiceRouterParams q = p;
      q.h = dh.get() + static_cast<size_t>(r) * hidden;
      q.rows = 1;
      Outputs one;
      ASSERT_NO_FATAL_FAILURE(Launch(q, &one));
      ASSERT_EQ(one.depth[0], out.depth[r]) << "row " << r;
      ASSERT_EQ(FloatBits(one.gate[0]), FloatBits(out.gate[r])) << "row " << r;
      for (int j = 0; j < nr; ++j) {
        ASSERT_EQ(FloatBits(one.scores[j]), FloatBits(out.scores[static_cast<size_t>(r) * nr + j]));
      }
    }
  }
}

TEST(TokenChoiceRouterParamsTest, RejectsBadParams) {
  TokenChoiceRouterParams p;
  p.num_recursions = 3;
  EXPECT_EQ(token_choice_router_forward(p, nullptr), cudaSuccess);  // rows 0
  TokenChoiceRouterParams bad = p;
  bad.num_recursions = kTokenChoiceMaxRecursions + 1;
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.num_recursions = 0;
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 2;  // null pointers
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
