// The early-exit confidence kernel (kernels/exit_confidence_kernels.cuh) on the CPU emulator
// against the executor's MaxProb in double, with exact decisions. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/exit_confidence_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(ExitConfidenceEmuTest, MatchesExecutorRule) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int vocab = 2000, rows = 5;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < vocab; ++i) logits[r * vocab + i] = dist(rng) * (1.0f + 5.0f * r);
  }
  std::vector<double> ref(rows);
  std::vector<float> th(rows);
  for (int r = 0; r < rows; ++r) {
    const float* l = &logits[r * vocab];
    const double m = *std::max_element(l, l + vocab);
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(l[i] - m);
    ref[r] = 1.0 / sum;
    th[r] = static_cast<float>(r % 2 == 0 ? ref[r] * 0.9 : ref[r] * 1.1);
  }
  std::vector<int32_t> exit(rows, -7);
  std::vector<double> prob(rows);
  cuda_emu::Run({static_cast<unsigned>(rows), 1, 1}, kThreads, [&] {
    ExitConfidenceKernel<float>(logits.data(), vocab, vocab, th.data(), exit.data(), prob.data());
  });
  for (int r = 0; r < rows; ++r) {
    EXPECT_NEAR(prob[r], ref[r], 1e-10 * ref[r]) << "row " << r;
    EXPECT_EQ(exit[r], r % 2 == 0 ? 1 : 0) << "row " << r;
  }
}

}  // namespace
}  // namespace morserve::kernels
