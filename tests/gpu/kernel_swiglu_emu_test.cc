// The SwiGLU kernel (kernels/swiglu_kernels.cuh) on the CPU emulator against the double
// definition, with a grid smaller than the work so the grid-stride loop wraps. Needs no
// device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/swiglu_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(SwigluEmuTest, MatchesDefinition) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int rows = 3, inter = 700;
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> in(rows * 2 * inter), out(rows * inter, std::nanf(""));
  for (float& v : in) v = dist(rng);
  const int64_t n = static_cast<int64_t>(rows) * inter;
  cuda_emu::Run({3, 1, 1}, kThreads,
                [&] { SwigluKernel<float, float>(in.data(), out.data(), n, inter); });
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inter; ++i) {
      const double g = in[r * 2 * inter + i], u = in[r * 2 * inter + inter + i];
      const double want = g / (1.0 + std::exp(-g)) * u;
      ASSERT_NEAR(out[r * inter + i], want, 1e-5 * std::abs(want) + 1e-30) << r << ", " << i;
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
