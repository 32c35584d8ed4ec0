// sampling_forward against the engine's CPU Sampler (engine/runtime/sampler.cc, compiled into
// this test) on fresh random logits: greedy, temperature, top_k, top_p, min_p and their
// combinations, continuous logits and heavily tied ones (rounded to halves, some -inf),
// vocab 49152 and 1000, the RNG step taken from the output history length as the sampler
// does. Tokens must be equal (integers, exact); the device result must also be identical
// on a second launch and for every row launched alone (batch invariance). The problem and
// the check are tests/gpu/sampling_problem.h, shared with the emulator test.
#include <vector>

#include "kernels/sampling.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/sampling_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::SamplingColumns;
using ::morserve::testing::SamplingProblem;

// Launches rows [first, first + count) of the problem on the device; the tokens.
void Launch(const SamplingProblem& pr, int first, int count, std::vector<int32_t>* tokens) {
  const SamplingColumns c = pr.Columns(first, count);
  DeviceBuffer<float> dlogits(static_cast<size_t>(count) * pr.vocab), dt(count), dtp(count),
      dmp(count);
  DeviceBuffer<int32_t> dtk(count), dtok(count);
  DeviceBuffer<float> dchosen(count);
  DeviceBuffer<uint64_t> dsd(count), dst(count);
  ASSERT_TRUE(dlogits.ok() && dt.ok() && dtp.ok() && dmp.ok() && dtk.ok() && dtok.ok() &&
              dsd.ok() && dst.ok());
  MORSERVE_CUDA_OK(cudaMemcpy(dlogits.get(), pr.Row(first),
                              static_cast<size_t>(count) * pr.vocab * sizeof(float),
                              cudaMemcpyHostToDevice));
  MORSERVE_CUDA_OK(dt.Upload(c.temperature));
  MORSERVE_CUDA_OK(dtk.Upload(c.top_k));
  MORSERVE_CUDA_OK(dtp.Upload(c.top_p));
  MORSERVE_CUDA_OK(dmp.Upload(c.min_p));
  MORSERVE_CUDA_OK(dsd.Upload(c.seed));
  MORSERVE_CUDA_OK(dst.Upload(c.step));
  MORSERVE_CUDA_OK(dtok.Poison());
  DeviceSamplingParams p;
  p.logits = dlogits.get();
  p.rows = count;
  p.vocab = pr.vocab;
  p.temperature = dt.get();
  p.top_k = dtk.get();
  p.top_p = dtp.get();
  p.min_p = dmp.get();
  p.seed = dsd.get();
  p.step = dst.get();
  p.token = dtok.get();
  p.chosen_logit = dchosen.get();
  MORSERVE_CUDA_OK(sampling_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(dtok.Download(tokens));
  std::vector<float> chosen;
  MORSERVE_CUDA_OK(dchosen.Download(&chosen));
  for (int r = 0; r < count; ++r) {  // the chosen token's raw logit (NaN for -1)
    if ((*tokens)[r] < 0) {
      EXPECT_TRUE(std::isnan(chosen[r])) << "row " << first + r;
    } else {
      EXPECT_EQ(chosen[r], pr.Row(first + r)[(*tokens)[r]]) << "row " << first + r;
    }
  }
}

class SamplingTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Check(int vocab, bool tied) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(SamplingProblem::Describe(vocab, tied, seed));
    const SamplingProblem pr = SamplingProblem::Make(seed, vocab, tied, 160);
    const int rows = pr.num_rows();
    std::vector<int32_t> got, again;
    ASSERT_NO_FATAL_FAILURE(Launch(pr, 0, rows, &got));
    ASSERT_NO_FATAL_FAILURE(Launch(pr, 0, rows, &again));
    EXPECT_EQ(got, again) << "two launches differ";
    ASSERT_NO_FATAL_FAILURE(pr.Check(got));
    for (int r = 0; r < rows; r += 7) {
      std::vector<int32_t> one;
      ASSERT_NO_FATAL_FAILURE(Launch(pr, r, 1, &one));
      ASSERT_EQ(one[0], got[r]) << "row " << r << " alone";
    }
  }
};

TEST_F(SamplingTest, MatchesCpuSamplerOnContinuousLogits) {
  ASSERT_NO_FATAL_FAILURE(Check(49152, false));
  ASSERT_NO_FATAL_FAILURE(Check(1000, false));
}

TEST_F(SamplingTest, MatchesCpuSamplerOnTiedLogits) {
  ASSERT_NO_FATAL_FAILURE(Check(49152, true));
  ASSERT_NO_FATAL_FAILURE(Check(1000, true));
}

// The same (seed, step) always draws the same token; different steps move the draw.
TEST(SamplingUniformTest, MatchesTheCpuSampler) {
  for (uint64_t seed : {0ull, 1ull, 0x123456789abcdefull}) {
    for (uint64_t step : {0ull, 1ull, 999ull}) {
      EXPECT_EQ(SamplingUniform(seed, step), UniformForStep(seed, step));
    }
  }
}

TEST(SamplingParamsTest, RejectsBadParams) {
  DeviceSamplingParams p;
  p.vocab = 10;
  EXPECT_EQ(sampling_forward(p, nullptr), cudaSuccess);  // rows 0
  DeviceSamplingParams bad = p;
  bad.row_stride = 3;
  EXPECT_EQ(sampling_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(sampling_forward(bad, nullptr), cudaErrorInvalidValue);
  // Processed rows and their per-row index come together (checked before any launch, so
  // these host pointers are never read).
  float f = 0.0f;
  int32_t i = 0;
  uint64_t u = 0;
  bad = p;
  bad.rows = 1;
  bad.logits = bad.temperature = bad.top_p = bad.min_p = &f;
  bad.top_k = &i;
  bad.token = &i;
  bad.seed = bad.step = &u;
  bad.processed = &f;
  EXPECT_EQ(sampling_forward(bad, nullptr), cudaErrorInvalidValue);
  bad.processed = nullptr;
  bad.processed_row = &i;
  EXPECT_EQ(sampling_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
