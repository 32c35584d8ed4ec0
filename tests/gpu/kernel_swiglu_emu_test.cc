// The SwiGLU kernel (kernels/swiglu_kernels.cuh) on the CPU emulator, on the GPU test's problem
// and check (tests/gpu/swiglu_problem.h: the double definition), every dtype pair, with
// poisoned outputs and a grid smaller than the work so the grid-stride loop wraps. Needs no
// device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/swiglu_kernels.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/swiglu_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::FreshSeed;
using ::morserve::testing::SwigluProblem;

template <typename TI, typename TO>
std::vector<uint8_t> RunEmulated(const SwigluProblem& pr) {
  std::vector<uint8_t> out(pr.out_bytes(), 0xFF);  // NaN in fp32 and bf16
  const int64_t n = static_cast<int64_t>(pr.out_count());
  cuda_emu::Run({3, 1, 1}, kThreads, [&] {
    SwigluKernel<TI, TO>(static_cast<const TI*>(pr.gate_up.data()),
                         reinterpret_cast<TO*>(out.data()), n, pr.inter);
  });
  return out;
}

std::vector<uint8_t> RunEmulated(const SwigluProblem& pr) {
  const bool in_bf16 = pr.gate_up.dtype == DType::kBF16, out_bf16 = pr.out_dtype == DType::kBF16;
  if (in_bf16)
    return out_bf16 ? RunEmulated<uint16_t, uint16_t>(pr) : RunEmulated<uint16_t, float>(pr);
  return out_bf16 ? RunEmulated<float, uint16_t>(pr) : RunEmulated<float, float>(pr);
}

TEST(SwigluEmuTest, MatchesDefinition) {
  for (DType in_t : {DType::kBF16, DType::kF32}) {
    for (DType out_t : {DType::kBF16, DType::kF32}) {
      const uint64_t seed = FreshSeed();
      const SwigluProblem pr = SwigluProblem::Make(seed, in_t, out_t, 3, 700);
      SCOPED_TRACE(pr.Describe(seed));
      ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(pr)));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
