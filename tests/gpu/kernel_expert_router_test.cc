// expert_router_forward against the executor's decision rule (ModelExecutor::DecideExpert)
// on fresh random inputs with poisoned outputs. Decisions (int32) must be exact. With given
// scores the gate is checked to 1e-6 relative (double math on both sides); with the linear
// router computed in the kernel, rows whose reference decide score lies within 1e-3 of the
// threshold (relative to the dot product's magnitude) are redrawn, so an exact decision is
// a fair demand of an fp32 dot product, and the score and gate are checked to 1e-5 of the
// dot product's magnitude (sum of |x_i w_i|).
// Batch invariance: every row alone gives the same bits as in the batch. The problems and the
// checks are tests/gpu/expert_router_problem.h, shared with the emulator test.
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/expert_router.cuh"
#include "tests/gpu/expert_router_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::ExpertRouterGivenProblem;
using ::morserve::testing::ExpertRouterLinearProblem;
using ::morserve::testing::ExpertRouterOutputs;
using ::morserve::testing::FloatBits;
using ::morserve::testing::ForEachLinearRouterProblem;
using ::morserve::testing::FreshSeed;

// Runs the kernel on device buffers already filled by the caller (p's pointers) and
// downloads the outputs.
void Launch(ExpertRouterParams p, int rows, ExpertRouterOutputs* out) {
  DeviceBuffer<int32_t> active(rows);
  DeviceBuffer<float> gate(rows), score(rows);
  ASSERT_TRUE(active.ok() && gate.ok() && score.ok());
  MORSERVE_CUDA_OK(active.Poison());
  MORSERVE_CUDA_OK(gate.Poison());
  MORSERVE_CUDA_OK(score.Poison());
  p.active = active.get();
  p.gate = gate.get();
  p.score_out = score.get();
  MORSERVE_CUDA_OK(expert_router_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(active.Download(&out->active));
  MORSERVE_CUDA_OK(gate.Download(&out->gate));
  MORSERVE_CUDA_OK(score.Download(&out->score));
}

class ExpertRouterTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(ExpertRouterTest, GivenScoresDecideExactly) {
  for (GateActivation act : {GateActivation::kSigmoid, GateActivation::kTanh}) {
    for (bool with_decide : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("seed=" + std::to_string(seed));
      const ExpertRouterGivenProblem pr =
          ExpertRouterGivenProblem::Make(seed, act, with_decide, 300);
      const int rows = pr.rows;
      DeviceBuffer<float> dscore(rows), ddecide(rows), dcap(pr.c.num_loops);
      DeviceBuffer<int32_t> dloops(rows);
      ASSERT_TRUE(dscore.ok() && ddecide.ok() && dcap.ok() && dloops.ok());
      MORSERVE_CUDA_OK(dscore.Upload(pr.score));
      MORSERVE_CUDA_OK(ddecide.Upload(pr.decide));
      MORSERVE_CUDA_OK(dcap.Upload(pr.c.capacity));
      MORSERVE_CUDA_OK(dloops.Upload(pr.loops));
      ExpertRouterParams p = pr.c.Params(rows);
      p.score_in = dscore.get();
      p.decide_in = with_decide ? ddecide.get() : nullptr;
      p.loops = dloops.get();
      p.capacity = dcap.get();
      ExpertRouterOutputs out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &out));
      ASSERT_NO_FATAL_FAILURE(pr.Check(out));
    }
  }
}

TEST_F(ExpertRouterTest, LinearRouterMatchesReferenceAndIsBatchInvariant) {
  ASSERT_NO_FATAL_FAILURE(
      ForEachLinearRouterProblem(64, 960, /*bad_row=*/-1, [](const ExpertRouterLinearProblem& pr) {
        const int rows = pr.rows, hidden = pr.hidden;
        DeviceBuffer<float> dh(pr.h.size()), dcap(pr.c.num_loops);
        DeviceBuffer<uint8_t> dw(pr.w.bytes()), daw(pr.aw.bytes());
        DeviceBuffer<int32_t> dloops(rows);
        ASSERT_TRUE(dh.ok() && dcap.ok() && dw.ok() && daw.ok() && dloops.ok());
        MORSERVE_CUDA_OK(dh.Upload(pr.h));
        MORSERVE_CUDA_OK(dcap.Upload(pr.c.capacity));
        MORSERVE_CUDA_OK(dloops.Upload(pr.loops));
        MORSERVE_CUDA_OK(cudaMemcpy(dw.get(), pr.w.data(), pr.w.bytes(), cudaMemcpyHostToDevice));
        MORSERVE_CUDA_OK(
            cudaMemcpy(daw.get(), pr.aw.data(), pr.aw.bytes(), cudaMemcpyHostToDevice));
        ExpertRouterParams p = pr.Params();
        p.h = dh.get();
        p.router_w = dw.get();
        p.aux_w = pr.aux ? daw.get() : nullptr;
        p.loops = dloops.get();
        p.capacity = dcap.get();
        ExpertRouterOutputs out;
        ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &out));
        ASSERT_NO_FATAL_FAILURE(pr.Check(out));
        for (int r = 0; r < rows; ++r) {  // each row alone
          ExpertRouterParams q = p;
          q.h = dh.get() + static_cast<size_t>(r) * hidden;
          q.loops = dloops.get() + r;
          q.rows = 1;
          ExpertRouterOutputs one;
          ASSERT_NO_FATAL_FAILURE(Launch(q, 1, &one));
          ASSERT_EQ(FloatBits(one.score[0]), FloatBits(out.score[r])) << "row " << r;
          ASSERT_EQ(FloatBits(one.gate[0]), FloatBits(out.gate[r])) << "row " << r;
          ASSERT_EQ(one.active[0], out.active[r]) << "row " << r;
        }
      }));
}

TEST_F(ExpertRouterTest, LoopOutsideRangeExitsWithNanGate) {
  std::vector<float> score = {1.0f, 1.0f, 1.0f}, cap = {1.0f, 1.0f};
  std::vector<int32_t> loops = {0, 2, -1};
  DeviceBuffer<float> dscore(3), dcap(2);
  DeviceBuffer<int32_t> dloops(3);
  ASSERT_TRUE(dscore.ok() && dcap.ok() && dloops.ok());
  MORSERVE_CUDA_OK(dscore.Upload(score));
  MORSERVE_CUDA_OK(dcap.Upload(cap));
  MORSERVE_CUDA_OK(dloops.Upload(loops));
  ExpertRouterParams p;
  p.score_in = dscore.get();
  p.loops = dloops.get();
  p.capacity = dcap.get();
  p.rows = 3;
  p.num_loops = 2;
  ExpertRouterOutputs out;
  ASSERT_NO_FATAL_FAILURE(Launch(p, 3, &out));
  EXPECT_EQ(out.active[0], 1);
  EXPECT_FALSE(std::isnan(out.gate[0]));
  for (int r : {1, 2}) {
    EXPECT_EQ(out.active[r], 0);
    EXPECT_TRUE(std::isnan(out.gate[r]));
  }
}

TEST(ExpertRouterParamsTest, RejectsBadParams) {
  ExpertRouterParams p;
  p.num_loops = 2;
  EXPECT_EQ(expert_router_forward(p, nullptr), cudaSuccess);  // rows 0, precomputed mode
  ExpertRouterParams bad = p;
  bad.temperature = 0.0f;
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.aux_w = &p;  // aux router without h
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  float x = 0;
  bad.h = &x;  // linear mode needs hidden > 0
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
