// The expert-choice router kernel (kernels/expert_router_kernels.cuh) on the CPU emulator, on the
// GPU test's problems and checks (tests/gpu/expert_router_problem.h): the linear router against
// a double dot product with fp32 and bf16 weights, with and without an aux router, one row's
// loop index outside the range; and given scores with decisions at the threshold, sigmoid and
// tanh gates. Outputs start poisoned. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "kernels/expert_router_kernels.cuh"
#include "tests/gpu/expert_router_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::ExpertRouterGivenProblem;
using ::morserve::testing::ExpertRouterLinearProblem;
using ::morserve::testing::ExpertRouterOutputs;
using ::morserve::testing::ForEachLinearRouterProblem;
using ::morserve::testing::FreshSeed;

// Runs the kernel on p's inputs (host pointers) into poisoned host outputs.
ExpertRouterOutputs RunEmulated(ExpertRouterParams p) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpertRouterOutputs out;
  out.active.assign(p.rows, -7);
  out.gate.assign(p.rows, nan);
  out.score.assign(p.rows, nan);
  p.active = out.active.data();
  p.gate = out.gate.data();
  p.score_out = out.score.data();
  cuda_emu::Run({static_cast<unsigned>(p.rows), 1, 1}, kThreads, [&] {
    if (p.w_dtype == DType::kBF16) {
      ExpertRouterKernel<uint16_t>(p);
    } else {
      ExpertRouterKernel<float>(p);
    }
  });
  return out;
}

TEST(ExpertRouterEmuTest, LinearRouterDecides) {
  ASSERT_NO_FATAL_FAILURE(
      ForEachLinearRouterProblem(8, 600, /*bad_row=*/6, [](const ExpertRouterLinearProblem& pr) {
        ExpertRouterParams p = pr.Params();
        p.h = pr.h.data();
        p.router_w = pr.w.data();
        p.aux_w = pr.aux ? pr.aw.data() : nullptr;
        p.loops = pr.loops.data();
        p.capacity = pr.c.capacity.data();
        ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(p)));
      }));
  for (GateActivation act : {GateActivation::kSigmoid, GateActivation::kTanh}) {
    for (bool with_decide : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("given scores, seed=" + std::to_string(seed));
      const ExpertRouterGivenProblem pr =
          ExpertRouterGivenProblem::Make(seed, act, with_decide, 40);
      ExpertRouterParams p = pr.c.Params(pr.rows);
      p.score_in = pr.score.data();
      p.decide_in = with_decide ? pr.decide.data() : nullptr;
      p.loops = pr.loops.data();
      p.capacity = pr.c.capacity.data();
      ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(p)));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
