// exit_confidence_forward against the executor's MaxProb (double, sequential) on fresh random
// logits: max probability to 1e-10 relative (two double sums in different orders); exit
// decisions exact, with per-row thresholds 10% below or above each row's max probability or
// drawn at least 1e-9 away from it, plus one threshold equal to the (float-rounded) reference,
// where the row is only checked for consistency with its own max_prob; bf16 and fp32 logits, a
// padded row
// stride; batch invariance bitwise. The problem and the check are
// tests/gpu/exit_confidence_problem.h, shared with the emulator test.
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/exit_confidence.cuh"
#include "tests/gpu/exit_confidence_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::ExitConfidenceProblem;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::KernelDTypeBytes;

class ExitConfidenceTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

struct Out {
  std::vector<int32_t> exit;
  std::vector<double> prob;
};

void Launch(ExitConfidenceParams p, Out* out) {
  DeviceBuffer<int32_t> dexit(p.rows);
  DeviceBuffer<double> dprob(p.rows);
  ASSERT_TRUE(dexit.ok() && dprob.ok());
  MORSERVE_CUDA_OK(dexit.Poison());
  MORSERVE_CUDA_OK(dprob.Poison());
  p.exit = dexit.get();
  p.max_prob = dprob.get();
  MORSERVE_CUDA_OK(exit_confidence_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(dexit.Download(&out->exit));
  MORSERVE_CUDA_OK(dprob.Download(&out->prob));
}

TEST_F(ExitConfidenceTest, MatchesExecutorRule) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int vocab : {49152, 300}) {
      const uint64_t seed = FreshSeed();
      const ExitConfidenceProblem pr = ExitConfidenceProblem::Make(seed, t, 40, vocab, 3);
      SCOPED_TRACE(pr.Describe(seed));
      const int rows = pr.rows;
      const int64_t stride = pr.stride;
      DeviceBuffer<uint8_t> dlogits(pr.logits.bytes());
      DeviceBuffer<float> dth(rows);
      ASSERT_TRUE(dlogits.ok() && dth.ok());
      MORSERVE_CUDA_OK(
          cudaMemcpy(dlogits.get(), pr.logits.data(), pr.logits.bytes(), cudaMemcpyHostToDevice));
      MORSERVE_CUDA_OK(dth.Upload(pr.thresholds));
      ExitConfidenceParams p;
      p.logits = dlogits.get();
      p.dtype = t;
      p.row_stride = stride;
      p.threshold = dth.get();
      p.rows = rows;
      p.vocab = vocab;
      Out out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
      ASSERT_NO_FATAL_FAILURE(pr.Check(out.exit, out.prob));
      for (int r = 0; r < rows; ++r) {  // each row alone
        ExitConfidenceParams q = p;
        q.logits = static_cast<const uint8_t*>(p.logits) + r * stride * KernelDTypeBytes(t);
        q.threshold = dth.get() + r;
        q.rows = 1;
        Out one;
        ASSERT_NO_FATAL_FAILURE(Launch(q, &one));
        ASSERT_EQ(one.prob[0], out.prob[r]) << "row " << r;
        ASSERT_EQ(one.exit[0], out.exit[r]) << "row " << r;
      }
    }
  }
}

TEST(ExitConfidenceParamsTest, RejectsBadParams) {
  ExitConfidenceParams p;
  p.vocab = 10;
  EXPECT_EQ(exit_confidence_forward(p, nullptr), cudaSuccess);  // rows 0
  ExitConfidenceParams bad = p;
  bad.dtype = DType::kF16;
  EXPECT_EQ(exit_confidence_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.row_stride = 4;
  EXPECT_EQ(exit_confidence_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(exit_confidence_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
