// argmax_forward against the CPU sampler's rule (largest logit, lowest index on ties) on
// fresh random logits, exactly: fp32 and bf16 (bf16 makes ties common), a padded row
// stride, planted ties at both ends of the vocabulary, -inf entries, NaN entries that must
// not win, and batch invariance (every row alone gives the same token). The problem and the
// check are tests/gpu/argmax_problem.h, shared with the emulator test.
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/argmax.cuh"
#include "tests/gpu/argmax_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::ArgmaxProblem;
using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::KernelDTypeBytes;

class ArgmaxTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

void Launch(const ArgmaxParams& base, int rows, std::vector<int32_t>* tokens,
            std::vector<float>* maxes) {
  DeviceBuffer<int32_t> dtok(rows);
  DeviceBuffer<float> dmax(rows);
  ASSERT_TRUE(dtok.ok() && dmax.ok());
  MORSERVE_CUDA_OK(dtok.Poison());
  MORSERVE_CUDA_OK(dmax.Poison());
  ArgmaxParams p = base;
  p.rows = rows;
  p.token = dtok.get();
  p.max_logit = dmax.get();
  MORSERVE_CUDA_OK(argmax_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(dtok.Download(tokens));
  MORSERVE_CUDA_OK(dmax.Download(maxes));
}

TEST_F(ArgmaxTest, LowestIndexOfTheLargestLogit) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int vocab : {49152, 1000, 1}) {
      const uint64_t seed = FreshSeed();
      const ArgmaxProblem pr = ArgmaxProblem::Make(seed, t, 23, vocab, 5, false);
      SCOPED_TRACE(pr.Describe(seed));
      const int rows = pr.rows;
      const int64_t stride = pr.stride;  // padded rows: the padding must not be read as logits
      DeviceBuffer<uint8_t> dlogits(pr.logits.bytes());
      ASSERT_TRUE(dlogits.ok());
      MORSERVE_CUDA_OK(
          cudaMemcpy(dlogits.get(), pr.logits.data(), pr.logits.bytes(), cudaMemcpyHostToDevice));
      ArgmaxParams p;
      p.logits = dlogits.get();
      p.dtype = t;
      p.row_stride = stride;
      p.vocab = vocab;
      std::vector<int32_t> tokens;
      std::vector<float> maxes;
      ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &tokens, &maxes));
      ASSERT_NO_FATAL_FAILURE(pr.Check(tokens, maxes));
      for (int r = 0; r < rows; ++r) {  // each row alone
        ArgmaxParams q = p;
        q.logits = static_cast<const uint8_t*>(p.logits) +
                   static_cast<size_t>(r) * stride * KernelDTypeBytes(t);
        std::vector<int32_t> one;
        std::vector<float> one_max;
        ASSERT_NO_FATAL_FAILURE(Launch(q, 1, &one, &one_max));
        ASSERT_EQ(one[0], tokens[r]) << "row " << r;
      }
    }
  }
}

TEST(ArgmaxParamsTest, RejectsBadParams) {
  ArgmaxParams p;
  p.vocab = 10;
  EXPECT_EQ(argmax_forward(p, nullptr), cudaSuccess);  // rows 0
  ArgmaxParams bad = p;
  bad.row_stride = 5;  // below vocab
  EXPECT_EQ(argmax_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.dtype = DType::kI32;
  EXPECT_EQ(argmax_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(argmax_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
