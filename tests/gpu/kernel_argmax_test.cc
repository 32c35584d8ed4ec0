// argmax_forward against the CPU sampler's rule (largest logit, lowest index on ties) on
// fresh random logits, exactly: fp32 and bf16 (bf16 makes ties common), a padded row
// stride, planted ties at both ends of the vocabulary, -inf entries, NaN entries that must
// not win, and batch invariance (every row alone gives the same token).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/argmax.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

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
      SCOPED_TRACE(std::string(t == DType::kBF16 ? "bf16" : "f32") +
                   " vocab=" + std::to_string(vocab) + " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int rows = 23;
      const int64_t stride = vocab + 5;  // padded rows: the padding must not be read as logits
      std::normal_distribution<float> dist(0.0f, 3.0f);
      std::vector<float> values(static_cast<size_t>(rows) * stride);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float inf = std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < values.size(); ++i) {
        values[i] = i % stride >= static_cast<size_t>(vocab) ? 1e30f : dist(rng);
      }
      auto at = [&](int r, int i) -> float& { return values[static_cast<size_t>(r) * stride + i]; };
      if (vocab > 10) {
        at(0, 3) = at(0, vocab - 1) = 100.0f;  // tie: lowest index wins
        at(1, vocab - 1) = 100.0f;             // the last index
        at(2, 0) = 100.0f;                     // the first index
        at(3, 5) = nan;                        // NaN never wins
        at(3, 6) = 50.0f;
        for (int i = 0; i < vocab; ++i) at(4, i) = -inf;  // all -inf: index 0
        at(5, 7) = inf;
        at(5, 9) = inf;
      }
      std::vector<uint16_t> bits;
      if (t == DType::kBF16) {
        for (float& v : values) {
          bits.push_back(F32ToBf16(v));
          v = Bf16ToF32(bits.back());
        }
      }
      const size_t bytes = values.size() * (t == DType::kBF16 ? 2 : 4);
      DeviceBuffer<uint8_t> dlogits(bytes);
      ASSERT_TRUE(dlogits.ok());
      const void* host = t == DType::kBF16 ? static_cast<const void*>(bits.data()) : values.data();
      MORSERVE_CUDA_OK(cudaMemcpy(dlogits.get(), host, bytes, cudaMemcpyHostToDevice));
      ArgmaxParams p;
      p.logits = dlogits.get();
      p.dtype = t;
      p.row_stride = stride;
      p.vocab = vocab;
      std::vector<int32_t> tokens;
      std::vector<float> maxes;
      ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &tokens, &maxes));
      for (int r = 0; r < rows; ++r) {
        int best = -1;  // the sampler's loop, skipping NaN
        for (int i = 0; i < vocab; ++i) {
          if (std::isnan(at(r, i))) continue;
          if (best < 0 || at(r, i) > at(r, best)) best = i;
        }
        ASSERT_EQ(tokens[r], best) << "row " << r;
        ASSERT_EQ(FloatBits(maxes[r]), FloatBits(at(r, best))) << "row " << r;
      }
      if (vocab > 10) {
        EXPECT_EQ(tokens[0], 3);
        EXPECT_EQ(tokens[1], vocab - 1);
        EXPECT_EQ(tokens[2], 0);
        EXPECT_EQ(tokens[3], 6);
        EXPECT_EQ(tokens[4], 0);
        EXPECT_EQ(tokens[5], 7);
      }
      for (int r = 0; r < rows; ++r) {  // each row alone
        ArgmaxParams q = p;
        q.logits = static_cast<const uint8_t*>(p.logits) +
                   static_cast<size_t>(r) * stride * (t == DType::kBF16 ? 2 : 4);
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
