// The token-choice router kernel (kernels/token_choice_router_kernels.cuh) on the CPU emulator,
// on the GPU test's problems and checks (tests/gpu/token_choice_router_problem.h): the linear
// router against a double dot product with fp32 and bf16 weights, and given scores with exact
// ties, bias, softmax and sigmoid gates. Outputs start poisoned. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "kernels/token_choice_router_kernels.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/token_choice_router_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::FreshSeed;
using ::morserve::testing::TokenChoiceGivenProblem;
using ::morserve::testing::TokenChoiceLinearProblem;
using ::morserve::testing::TokenChoiceOutputs;

// Runs the kernel on p's inputs (host pointers) into poisoned host outputs.
TokenChoiceOutputs RunEmulated(TokenChoiceRouterParams p) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  TokenChoiceOutputs out;
  out.depth.assign(p.rows, -7);
  out.gate.assign(p.rows, nan);
  out.scores.assign(static_cast<size_t>(p.rows) * p.num_recursions, nan);
  p.depth = out.depth.data();
  p.gate = out.gate.data();
  p.scores_out = out.scores.data();
  cuda_emu::Run({static_cast<unsigned>(p.rows), 1, 1}, kThreads, [&] {
    if (p.w_dtype == DType::kBF16) {
      TokenChoiceKernel<uint16_t>(p);
    } else {
      TokenChoiceKernel<float>(p);
    }
  });
  return out;
}

TEST(TokenChoiceRouterEmuTest, LinearScoresAndGivenTies) {
  for (DType w_t : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("w=" + ::morserve::testing::KernelDTypeName(w_t) +
                 " seed=" + std::to_string(seed));
    const TokenChoiceLinearProblem pr = TokenChoiceLinearProblem::Make(seed, w_t, 4, 300, 3);
    TokenChoiceRouterParams p = pr.Params();
    p.h = pr.h.data();
    p.router_w = pr.w.data();
    ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(p)));
  }
  for (auto act : {TokenChoiceActivation::kSoftmax, TokenChoiceActivation::kSigmoid}) {
    for (bool with_bias : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("given scores, seed=" + std::to_string(seed));
      const TokenChoiceGivenProblem pr = TokenChoiceGivenProblem::Make(seed, act, with_bias, 20);
      TokenChoiceRouterParams p = pr.Params();
      p.scores_in = pr.scores.data();
      p.bias = with_bias ? pr.bias.data() : nullptr;
      ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(p)));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
