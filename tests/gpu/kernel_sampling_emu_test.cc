// The device sampling kernel (the same source as the GPU build: kernels/sampling_kernels.cuh)
// on the CPU emulator (kernels/emu/cuda_emu.h) against the engine's CPU Sampler, exactly:
// greedy, temperature, top_k, top_p, min_p and combinations on continuous and heavily tied
// logits, plus batch invariance, on the GPU test's problem and check
// (tests/gpu/sampling_problem.h); planted ties and all -inf rows. Small vocabularies keep it
// fast; the GPU test covers 49152. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling_kernels.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/sampling_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::FreshSeed;
using ::morserve::testing::SamplingColumns;
using ::morserve::testing::SamplingProblem;

// Emulated launch over rows [first, first + count) of the problem; each row's chosen raw
// logit is checked against its token (NaN for -1).
std::vector<int32_t> Emulate(const SamplingProblem& pr, int first, int count) {
  const SamplingColumns c = pr.Columns(first, count);
  std::vector<int32_t> token(count, -7);
  std::vector<float> chosen(count, 12345.0f);
  const Args a{pr.Row(first),  pr.vocab,       pr.vocab,       c.temperature.data(),
               c.top_k.data(), c.top_p.data(), c.min_p.data(), c.seed.data(),
               c.step.data(),  token.data(),   chosen.data()};
  cuda_emu::Run({static_cast<unsigned>(count), 1, 1}, kThreads, [&] { SampleKernel(a); });
  for (int r = 0; r < count; ++r) {
    if (token[r] < 0) {
      EXPECT_TRUE(std::isnan(chosen[r])) << "row " << first + r;
    } else {
      EXPECT_EQ(chosen[r], pr.Row(first + r)[token[r]]) << "row " << first + r;
    }
  }
  return token;
}

void Check(int vocab, bool tied) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(SamplingProblem::Describe(vocab, tied, seed));
  const SamplingProblem pr = SamplingProblem::Make(seed, vocab, tied, 24);
  const int n = pr.num_rows();
  const std::vector<int32_t> got = Emulate(pr, 0, n);
  ASSERT_NO_FATAL_FAILURE(pr.Check(got));
  for (int r : {0, n / 2, n - 1}) {  // alone
    ASSERT_EQ(Emulate(pr, r, 1)[0], got[r]) << "row " << r << " alone";
  }
}

TEST(SamplingEmuTest, MatchesCpuSampler) {
  ASSERT_NO_FATAL_FAILURE(Check(1000, false));
  ASSERT_NO_FATAL_FAILURE(Check(1000, true));
  ASSERT_NO_FATAL_FAILURE(Check(3001, true));  // not a multiple of the block size
}

// Planted cases: top_k ties resolved by lowest id, top_k 1 == greedy, all -inf -> -1.
TEST(SamplingEmuTest, PlantedCases) {
  SamplingProblem pr;
  pr.vocab = 600;
  const int vocab = pr.vocab;
  pr.logits.assign(3 * vocab, 0.0f);
  for (int i = 0; i < vocab; ++i) pr.logits[i] = (i == 10 || i == 500) ? 5.0f : -1.0f;
  for (int i = 0; i < vocab; ++i) pr.logits[vocab + i] = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) pr.logits[2 * vocab + i] = static_cast<float>(i % 7);
  pr.rows = {{1.0f, 1, 1.0f, 0.0f, 1, 0},   // top_k 1: the lower tie, 10
             {1.0f, 0, 1.0f, 0.0f, 2, 3},   // all -inf: -1
             {0.8f, 2, 1.0f, 0.0f, 3, 5}};  // ties at 6: ids 6 and 13 only
  const std::vector<int32_t> got = Emulate(pr, 0, pr.num_rows());
  EXPECT_EQ(got[0], 10);
  EXPECT_EQ(got[1], -1);
  EXPECT_TRUE(got[2] == 6 || got[2] == 13) << got[2];
}

}  // namespace
}  // namespace morserve::kernels
