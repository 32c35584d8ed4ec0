// The gated residual add kernel (kernels/scale_add_kernels.cuh) on the CPU emulator, bitwise
// against ScaleAddRows' arithmetic, with a grid smaller than the work so the grid-stride loop
// wraps, with and without per-row scales. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/scale_add_kernels.cuh"

namespace morserve::kernels {
namespace {

TEST(ScaleAddEmuTest, BitwiseEqualToCpuArithmetic) {
  std::random_device rd;
  std::mt19937_64 rng(rd());
  const int rows = 5, dim = 333;
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> h(rows * dim), b(rows * dim), scale(rows);
  for (float& v : h) v = dist(rng);
  for (float& v : b) v = dist(rng);
  for (float& v : scale) v = dist(rng) * 0.1f;
  for (bool with_scale : {true, false}) {
    std::vector<float> got = h;
    const int64_t n = static_cast<int64_t>(rows) * dim;
    cuda_emu::Run({2, 1, 1}, kThreads, [&] {
      ScaleAddKernel<float>(got.data(), b.data(), with_scale ? scale.data() : nullptr, n, dim);
    });
    for (int i = 0; i < rows * dim; ++i) {
      const float want = with_scale
                             ? static_cast<float>(h[i] + static_cast<double>(scale[i / dim]) * b[i])
                             : h[i] + b[i];
      ASSERT_EQ(got[i], want) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
