// The gated residual add kernel (kernels/scale_add_kernels.cuh) on the CPU emulator, on the GPU
// test's problem and check (tests/gpu/scale_add_problem.h: bitwise against ScaleAddRows'
// arithmetic), fp32 and bf16 b, with and without per-row scales, with a grid smaller than the
// work so the grid-stride loop wraps. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/scale_add_kernels.cuh"
#include "tests/gpu/scale_add_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::FreshSeed;
using ::morserve::testing::ScaleAddProblem;

template <typename TB>
std::vector<float> RunEmulated(const ScaleAddProblem& pr) {
  std::vector<float> got = pr.h;
  const int64_t n = static_cast<int64_t>(pr.rows) * pr.dim;
  cuda_emu::Run({2, 1, 1}, kThreads, [&] {
    ScaleAddKernel<TB>(got.data(), static_cast<const TB*>(pr.b.data()), pr.scale_or_null(), n,
                       pr.dim);
  });
  return got;
}

TEST(ScaleAddEmuTest, BitwiseEqualToCpuArithmetic) {
  for (DType b_t : {DType::kF32, DType::kBF16}) {
    for (bool with_scale : {true, false}) {
      const uint64_t seed = FreshSeed();
      const ScaleAddProblem pr = ScaleAddProblem::Make(seed, b_t, with_scale, 5, 333);
      SCOPED_TRACE(pr.Describe(seed));
      const std::vector<float> got =
          b_t == DType::kBF16 ? RunEmulated<uint16_t>(pr) : RunEmulated<float>(pr);
      ASSERT_NO_FATAL_FAILURE(pr.Check(got));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
