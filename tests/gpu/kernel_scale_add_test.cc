// scale_add_forward against the CPU backend's arithmetic (ScaleAddRows: h + scale * b in
// double, rounded once), bitwise, on fresh random inputs: per-row scales, no scale (plain
// residual add, checked against the fp32 sum), fp32 and bf16 b. The problem and the check are
// tests/gpu/scale_add_problem.h, shared with the emulator test.
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/scale_add.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/scale_add_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::ScaleAddProblem;

class ScaleAddTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(DType b_t, bool with_scale, int rows, int dim) {
    const uint64_t seed = FreshSeed();
    const ScaleAddProblem pr = ScaleAddProblem::Make(seed, b_t, with_scale, rows, dim);
    SCOPED_TRACE(pr.Describe(seed));
    DeviceBuffer<float> dh(pr.h.size()), dscale(rows);
    DeviceBuffer<uint8_t> db(pr.b.bytes());
    ASSERT_TRUE(dh.ok() && dscale.ok() && db.ok());
    MORSERVE_CUDA_OK(dh.Upload(pr.h));
    MORSERVE_CUDA_OK(dscale.Upload(pr.scale));
    MORSERVE_CUDA_OK(cudaMemcpy(db.get(), pr.b.data(), pr.b.bytes(), cudaMemcpyHostToDevice));
    ScaleAddParams p;
    p.h = dh.get();
    p.b = db.get();
    p.scale = with_scale ? dscale.get() : nullptr;
    p.rows = rows;
    p.dim = dim;
    p.b_dtype = b_t;
    MORSERVE_CUDA_OK(scale_add_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got;
    MORSERVE_CUDA_OK(dh.Download(&got));
    ASSERT_NO_FATAL_FAILURE(pr.Check(got));
  }
};

TEST_F(ScaleAddTest, BitwiseEqualToCpuArithmetic) {
  for (DType b_t : {DType::kF32, DType::kBF16}) {
    for (bool with_scale : {true, false}) {
      ASSERT_NO_FATAL_FAILURE(Run(b_t, with_scale, 37, 960));
      ASSERT_NO_FATAL_FAILURE(Run(b_t, with_scale, 1, 7));
    }
  }
}

TEST(ScaleAddParamsTest, RejectsBadParams) {
  ScaleAddParams p;
  p.dim = 8;
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaSuccess);  // rows 0
  p.b_dtype = DType::kF16;
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaErrorInvalidValue);
  p.b_dtype = DType::kF32;
  p.rows = 2;  // null pointers
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
