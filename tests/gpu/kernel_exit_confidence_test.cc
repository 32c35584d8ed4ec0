// exit_confidence_forward against the executor's MaxProb (double, sequential) on fresh random
// logits: max probability to 1e-10 relative (two double sums in different orders); exit
// decisions exact, with per-row thresholds drawn at least 1e-9 away from each row's max
// probability, plus one threshold equal to the (float-rounded) reference, where the row is
// only checked for consistency with its own max_prob; bf16 and fp32 logits, a padded row
// stride; batch invariance bitwise.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/exit_confidence.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

double MaxProb(const float* logits, int vocab) {
  const double m = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - m);
  return 1.0 / sum;
}

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
      SCOPED_TRACE(std::string(t == DType::kBF16 ? "bf16" : "f32") +
                   " vocab=" + std::to_string(vocab) + " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int rows = 40;
      const int64_t stride = vocab + 3;
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      std::vector<float> values(static_cast<size_t>(rows) * stride, 0.0f);
      std::vector<uint16_t> bits;
      for (int r = 0; r < rows; ++r) {
        const float sharpness = 1.0f + 4.0f * (r % 5);  // from flat to confident rows
        for (int i = 0; i < vocab; ++i) values[r * stride + i] = dist(rng) * sharpness;
      }
      if (t == DType::kBF16) {
        for (float& v : values) {
          bits.push_back(F32ToBf16(v));
          v = Bf16ToF32(bits.back());
        }
      }
      std::vector<double> ref(rows);
      std::vector<float> thresholds(rows);
      for (int r = 0; r < rows; ++r) {
        ref[r] = MaxProb(&values[r * stride], vocab);
        float th;
        do {
          th = static_cast<float>(unit(rng));
        } while (std::abs(th - ref[r]) < 1e-9);
        thresholds[r] = th;
      }
      thresholds[0] = static_cast<float>(ref[0]);  // equality case (float-rounded)
      const size_t bytes = values.size() * (t == DType::kBF16 ? 2 : 4);
      DeviceBuffer<uint8_t> dlogits(bytes);
      DeviceBuffer<float> dth(rows);
      ASSERT_TRUE(dlogits.ok() && dth.ok());
      const void* host = t == DType::kBF16 ? static_cast<const void*>(bits.data()) : values.data();
      MORSERVE_CUDA_OK(cudaMemcpy(dlogits.get(), host, bytes, cudaMemcpyHostToDevice));
      MORSERVE_CUDA_OK(dth.Upload(thresholds));
      ExitConfidenceParams p;
      p.logits = dlogits.get();
      p.dtype = t;
      p.row_stride = stride;
      p.threshold = dth.get();
      p.rows = rows;
      p.vocab = vocab;
      Out out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, &out));
      for (int r = 0; r < rows; ++r) {
        ASSERT_NEAR(out.prob[r], ref[r], 1e-10 * ref[r]) << "row " << r;
        ASSERT_EQ(out.exit[r], out.prob[r] >= thresholds[r] ? 1 : 0) << "row " << r;
        if (r > 0) ASSERT_EQ(out.exit[r], ref[r] >= thresholds[r] ? 1 : 0) << "row " << r;
      }
      for (int r = 0; r < rows; ++r) {  // each row alone
        ExitConfidenceParams q = p;
        q.logits = static_cast<const uint8_t*>(p.logits) + r * stride * (t == DType::kBF16 ? 2 : 4);
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
