// The early-exit confidence kernel (kernels/exit_confidence_kernels.cuh) on the CPU emulator, on
// the GPU test's problem and check (tests/gpu/exit_confidence_problem.h: the executor's
// MaxProb in double, exact decisions), fp32 and bf16 logits with a padded row stride. Needs no
// device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/exit_confidence_kernels.cuh"
#include "tests/gpu/exit_confidence_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::ExitConfidenceProblem;
using ::morserve::testing::FreshSeed;

template <typename T>
void RunEmulated(const ExitConfidenceProblem& pr, std::vector<int32_t>* exit,
                 std::vector<double>* prob) {
  exit->assign(pr.rows, -7);
  prob->assign(pr.rows, 0.0);
  cuda_emu::Run({static_cast<unsigned>(pr.rows), 1, 1}, kThreads, [&] {
    ExitConfidenceKernel<T>(static_cast<const T*>(pr.logits.data()), pr.stride, pr.vocab,
                            pr.thresholds.data(), exit->data(), prob->data());
  });
}

TEST(ExitConfidenceEmuTest, MatchesExecutorRule) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = FreshSeed();
    const ExitConfidenceProblem pr = ExitConfidenceProblem::Make(seed, t, 6, 2000, 3);
    SCOPED_TRACE(pr.Describe(seed));
    std::vector<int32_t> exit;
    std::vector<double> prob;
    if (t == DType::kBF16) {
      RunEmulated<uint16_t>(pr, &exit, &prob);
    } else {
      RunEmulated<float>(pr, &exit, &prob);
    }
    ASSERT_NO_FATAL_FAILURE(pr.Check(exit, prob));
  }
}

}  // namespace
}  // namespace morserve::kernels
