// The greedy argmax kernel (kernels/argmax_kernels.cuh) on the CPU emulator, on the GPU test's
// problem and check (tests/gpu/argmax_problem.h: the sampler's rule exactly, planted ties, NaN
// and infinities, a padded row stride), fp32 with whole-number logits (ties for the largest
// are common) and bf16. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/argmax_kernels.cuh"
#include "tests/gpu/argmax_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::ArgmaxProblem;
using ::morserve::testing::FreshSeed;

template <typename T>
void RunEmulated(const ArgmaxProblem& pr, std::vector<int32_t>* token, std::vector<float>* best) {
  token->assign(pr.rows, -7);
  best->assign(pr.rows, 0.0f);
  cuda_emu::Run({static_cast<unsigned>(pr.rows), 1, 1}, kThreads, [&] {
    ArgmaxKernel<T>(static_cast<const T*>(pr.logits.data()), pr.stride, pr.vocab, token->data(),
                    best->data());
  });
}

TEST(ArgmaxEmuTest, LowestIndexOfTheLargest) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = FreshSeed();
    const ArgmaxProblem pr = ArgmaxProblem::Make(seed, t, 7, 1500, 3, t == DType::kF32);
    SCOPED_TRACE(pr.Describe(seed));
    std::vector<int32_t> token;
    std::vector<float> best;
    if (t == DType::kBF16) {
      RunEmulated<uint16_t>(pr, &token, &best);
    } else {
      RunEmulated<float>(pr, &token, &best);
    }
    ASSERT_NO_FATAL_FAILURE(pr.Check(token, best));
  }
}

}  // namespace
}  // namespace morserve::kernels
