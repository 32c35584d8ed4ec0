// token_choice_router_forward against the executor's rule (ModelExecutor::EntryRouting) on
// fresh random inputs with poisoned outputs: depths exact (ties to the lowest index, bias
// applied), gates to 1e-6 relative with given scores; with the linear router computed in
// the kernel, rows whose best and second-best biased probabilities lie within 1e-4 are
// redrawn so the exact depth is a fair demand of fp32 scores. Batch invariance is bitwise.
// The problems and the checks are tests/gpu/token_choice_router_problem.h, shared with the
// emulator test.
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/token_choice_router.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/token_choice_router_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::KernelDTypeName;
using ::morserve::testing::TokenChoiceGivenProblem;
using ::morserve::testing::TokenChoiceLinearProblem;
using ::morserve::testing::TokenChoiceOutputs;

void Launch(TokenChoiceRouterParams p, TokenChoiceOutputs* out) {
  DeviceBuffer<int32_t> depth(p.rows);
  DeviceBuffer<float> gate(p.rows), scores(static_cast<size_t>(p.rows) * p.num_recursions);
  ASSERT_TRUE(depth.ok() && gate.ok() && scores.ok());
  MORSERVE_CUDA_OK(depth.Poison());
  MORSERVE_CUDA_OK(gate.Poison());
  MORSERVE_CUDA_OK(scores.Poison());
  p.depth = depth.get();
  p.gate = gate.get();
  p.scores_out = scores.get();
  MORSERVE_CUDA_OK(token_choice_router_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(depth.Download(&out->depth));
  MORSERVE_CUDA_OK(gate.Download(&out->gate));
  MORSERVE_CUDA_OK(scores.Download(&out->scores));
}

class TokenChoiceRouterTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(TokenChoiceRouterTest, GivenScoresDecideExactly) {
  for (auto act : {TokenChoiceActivation::kSoftmax, TokenChoiceActivation::kSigmoid}) {
    for (bool with_bias : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("seed=" + std::to_string(seed));
      const TokenChoiceGivenProblem pr = TokenChoiceGivenProblem::Make(seed, act, with_bias, 200);
      DeviceBuffer<float> dscores(pr.scores.size()), dbias(pr.nr);
      ASSERT_TRUE(dscores.ok() && dbias.ok());
      MORSERVE_CUDA_OK(dscores.Upload(pr.scores));
      if (with_bias) MORSERVE_CUDA_OK(dbias.Upload(pr.bias));
      TokenChoiceRouterParams p = pr.Params();
      p.scores_in = dscores.get();
      p.bias = with_bias ? dbias.get() : nullptr;
      TokenChoiceOutputs out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
      ASSERT_NO_FATAL_FAILURE(pr.Check(out));
    }
  }
}

TEST_F(TokenChoiceRouterTest, LinearRouterMatchesReferenceAndIsBatchInvariant) {
  for (DType w_t : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("w=" + KernelDTypeName(w_t) + " seed=" + std::to_string(seed));
    const TokenChoiceLinearProblem pr = TokenChoiceLinearProblem::Make(seed, w_t, 48, 576, 3);
    const int rows = pr.rows, hidden = pr.hidden, nr = pr.nr;
    DeviceBuffer<float> dh(pr.h.size());
    DeviceBuffer<uint8_t> dw(pr.w.bytes());
    ASSERT_TRUE(dh.ok() && dw.ok());
    MORSERVE_CUDA_OK(dh.Upload(pr.h));
    MORSERVE_CUDA_OK(cudaMemcpy(dw.get(), pr.w.data(), pr.w.bytes(), cudaMemcpyHostToDevice));
    TokenChoiceRouterParams p = pr.Params();
    p.h = dh.get();
    p.router_w = dw.get();
    TokenChoiceOutputs out;
    ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
    ASSERT_NO_FATAL_FAILURE(pr.Check(out));
    for (int r = 0; r < rows; ++r) {
      TokenChoiceRouterParams q = p;
      q.h = dh.get() + static_cast<size_t>(r) * hidden;
      q.rows = 1;
      TokenChoiceOutputs one;
      ASSERT_NO_FATAL_FAILURE(Launch(q, &one));
      ASSERT_EQ(one.depth[0], out.depth[r]) << "row " << r;
      ASSERT_EQ(FloatBits(one.gate[0]), FloatBits(out.gate[r])) << "row " << r;
      for (int j = 0; j < nr; ++j) {
        ASSERT_EQ(FloatBits(one.scores[j]), FloatBits(out.scores[static_cast<size_t>(r) * nr + j]));
      }
    }
  }
}

TEST(TokenChoiceRouterParamsTest, RejectsBadParams) {
  TokenChoiceRouterParams p;
  p.num_recursions = 3;
  EXPECT_EQ(token_choice_router_forward(p, nullptr), cudaSuccess);  // rows 0
  TokenChoiceRouterParams bad = p;
  bad.num_recursions = kTokenChoiceMaxRecursions + 1;
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.num_recursions = 0;
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 2;  // null pointers
  EXPECT_EQ(token_choice_router_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
