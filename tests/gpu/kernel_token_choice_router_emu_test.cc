// The token-choice router kernel (kernels/token_choice_router_kernels.cuh) on the CPU
// emulator: linear scores against a double dot product, depth = argmax + 1 with ties to the
// lowest index, bias, and the gate. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/token_choice_router_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(TokenChoiceRouterEmuTest, LinearScoresAndGivenTies) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int rows = 4, hidden = 300, nr = 3;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> h(rows * hidden), w(nr * hidden);
  for (float& v : h) v = dist(rng);
  for (float& v : w) v = dist(rng) * 0.1f;
  std::vector<int32_t> depth(rows, -7);
  std::vector<float> gate(rows), scores(rows * nr);
  TokenChoiceRouterParams p;
  p.h = h.data();
  p.router_w = w.data();
  p.scores_out = scores.data();
  p.depth = depth.data();
  p.gate = gate.data();
  p.rows = rows;
  p.hidden = hidden;
  p.num_recursions = nr;
  p.alpha = 1.0f;
  cuda_emu::Run({rows, 1, 1}, kThreads, [&] { TokenChoiceKernel<float>(p); });
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < nr; ++j) {
      double s = 0;
      for (int i = 0; i < hidden; ++i)
        s += static_cast<double>(h[r * hidden + i]) * w[j * hidden + i];
      EXPECT_NEAR(scores[r * nr + j], s, 1e-4) << "row " << r << " score " << j;
    }
    const float* s = &scores[r * nr];
    int best = 0;
    for (int j = 1; j < nr; ++j) {
      if (s[j] > s[best]) best = j;
    }
    EXPECT_EQ(depth[r], best + 1) << "row " << r;  // softmax is monotone in the score
  }

  // Given scores with ties and a bias; sigmoid gate.
  const std::vector<float> given = {1.0f, 1.0f, 0.0f, /**/ -1.0f, 2.0f, 2.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f};
  std::vector<int32_t> d2(2, -7);
  std::vector<float> g2(2);
  TokenChoiceRouterParams q;
  q.scores_in = given.data();
  q.bias = bias.data();
  q.depth = d2.data();
  q.gate = g2.data();
  q.rows = 2;
  q.num_recursions = nr;
  q.alpha = 0.5f;
  q.activation = TokenChoiceActivation::kSigmoid;
  cuda_emu::Run({2, 1, 1}, kThreads, [&] { TokenChoiceKernel<float>(q); });
  EXPECT_EQ(d2[0], 1);
  EXPECT_EQ(d2[1], 2);
  EXPECT_FLOAT_EQ(g2[0], static_cast<float>(0.5 / (1.0 + std::exp(-1.0))));
  EXPECT_FLOAT_EQ(g2[1], static_cast<float>(0.5 / (1.0 + std::exp(-2.0))));
}

}  // namespace
}  // namespace morserve::kernels
