// swiglu_forward against a CPU reference in double (SiluMulRows' definition) on fresh random
// inputs with poisoned outputs: every dtype pair, per-element relative error under 1e-2 for
// bf16 output (one rounding) and 1e-5 for fp32 output (fp32 evaluation). The problem and the
// check are tests/gpu/swiglu_problem.h, shared with the emulator test.
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/swiglu.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/swiglu_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::SwigluProblem;

class SwigluTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(DType in_t, DType out_t, int rows, int inter) {
    const uint64_t seed = FreshSeed();
    const SwigluProblem pr = SwigluProblem::Make(seed, in_t, out_t, rows, inter);
    SCOPED_TRACE(pr.Describe(seed));
    DeviceBuffer<uint8_t> din(pr.gate_up.bytes()), dout(pr.out_bytes());
    ASSERT_TRUE(din.ok() && dout.ok());
    MORSERVE_CUDA_OK(
        cudaMemcpy(din.get(), pr.gate_up.data(), pr.gate_up.bytes(), cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dout.Poison());
    SwigluParams p;
    p.gate_up = din.get();
    p.out = dout.get();
    p.rows = rows;
    p.inter = inter;
    p.in_dtype = in_t;
    p.out_dtype = out_t;
    MORSERVE_CUDA_OK(swiglu_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> raw;
    MORSERVE_CUDA_OK(dout.Download(&raw));
    ASSERT_NO_FATAL_FAILURE(pr.Check(raw));
  }
};

TEST_F(SwigluTest, MatchesReference) {
  for (DType in_t : {DType::kBF16, DType::kF32}) {
    for (DType out_t : {DType::kBF16, DType::kF32}) {
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 33, 2560));  // SmolLM-360M intermediate
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 3, 1000));
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 1, 1));
    }
  }
}

TEST(SwigluParamsTest, RejectsBadParams) {
  SwigluParams p;
  p.inter = 8;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaSuccess);  // rows 0
  p.in_dtype = DType::kF16;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
  p.in_dtype = DType::kBF16;
  p.rows = 2;  // null pointers
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
  p.inter = 0;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
