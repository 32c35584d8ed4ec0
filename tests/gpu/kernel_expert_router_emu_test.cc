// The expert-choice router kernel (kernels/expert_router_kernels.cuh) on the CPU emulator:
// linear scores against a double dot product, decisions and gates against the executor's
// rule, an aux router, and a loop index outside the range. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/expert_router_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(ExpertRouterEmuTest, LinearRouterDecides) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int rows = 8, hidden = 600, loops = 3;
  const float temperature = 1.5f, threshold = 0.05f, alpha = 0.8f;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> h(rows * hidden), w(loops * hidden), aux(loops * hidden);
  for (float& v : h) v = dist(rng);
  for (float& v : w) v = dist(rng) * 0.05f;
  for (float& v : aux) v = dist(rng) * 0.05f;
  const std::vector<int32_t> loop_of = {0, 1, 2, 1, 0, 2, 5, 1};  // row 6: outside the range
  const std::vector<float> capacity = {0.5f, 1.0f, 0.25f};
  std::vector<int32_t> active(rows, -7);
  std::vector<float> gate(rows), score(rows);
  ExpertRouterParams p;
  p.h = h.data();
  p.router_w = w.data();
  p.aux_w = aux.data();
  p.w_dtype = DType::kF32;
  p.loops = loop_of.data();
  p.capacity = capacity.data();
  p.score_out = score.data();
  p.active = active.data();
  p.gate = gate.data();
  p.rows = rows;
  p.hidden = hidden;
  p.num_loops = loops;
  p.temperature = temperature;
  p.threshold = threshold;
  p.alpha = alpha;
  cuda_emu::Run({rows, 1, 1}, kThreads, [&] { ExpertRouterKernel<float>(p); });
  for (int r = 0; r < rows; ++r) {
    if (r == 6) {
      EXPECT_EQ(active[r], 0);
      EXPECT_TRUE(std::isnan(gate[r]));
      continue;
    }
    double s = 0, d = 0, mag = 0;
    for (int i = 0; i < hidden; ++i) {
      const double x = h[r * hidden + i] / temperature;
      s += x * w[loop_of[r] * hidden + i];
      d += x * aux[loop_of[r] * hidden + i];
      mag += std::abs(x * w[loop_of[r] * hidden + i]);
    }
    EXPECT_NEAR(score[r], s, 1e-5 * mag) << "row " << r;
    if (std::abs(d - threshold) > 1e-3) {
      EXPECT_EQ(active[r], capacity[loop_of[r]] >= 1.0f || d > threshold ? 1 : 0) << "row " << r;
    }
    EXPECT_NEAR(gate[r], alpha / (1.0 + std::exp(-s)), 1e-5) << "row " << r;
  }
}

}  // namespace
}  // namespace morserve::kernels
