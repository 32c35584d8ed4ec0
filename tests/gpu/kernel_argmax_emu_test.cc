// The greedy argmax kernel (kernels/argmax_kernels.cuh) on the CPU emulator against the
// sampler's rule (largest logit, lowest index on ties, NaN never wins), exactly, with a
// padded row stride. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/argmax_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(ArgmaxEmuTest, LowestIndexOfTheLargest) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int vocab = 1500, stride = 1503, rows = 6;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(rows) * stride, 1e30f);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < vocab; ++i) logits[r * stride + i] = std::round(dist(rng) * 4.0f);  // ties
  }
  logits[1 * stride + 0] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < vocab; ++i) logits[2 * stride + i] = -std::numeric_limits<float>::infinity();
  logits[3 * stride + vocab - 1] = 1e9f;
  std::vector<int32_t> token(rows, -7);
  std::vector<float> best(rows);
  cuda_emu::Run({static_cast<unsigned>(rows), 1, 1}, kThreads, [&] {
    ArgmaxKernel<float>(logits.data(), stride, vocab, token.data(), best.data());
  });
  for (int r = 0; r < rows; ++r) {
    int want = -1;
    for (int i = 0; i < vocab; ++i) {
      const float v = logits[r * stride + i];
      if (std::isnan(v)) continue;
      if (want < 0 || v > logits[r * stride + want]) want = i;
    }
    EXPECT_EQ(token[r], want) << "row " << r;
  }
  EXPECT_EQ(token[2], 0);
  EXPECT_EQ(token[3], vocab - 1);
}

}  // namespace
}  // namespace morserve::kernels
