// sampling_forward against the engine's CPU Sampler (engine/runtime/sampler.cc, compiled into
// this test) on fresh random logits: greedy, temperature, top_k, top_p, min_p and their
// combinations, continuous logits and heavily tied ones (rounded to halves, some -inf),
// vocab 49152 and 1000, the RNG step taken from the output history length as the sampler
// does. Tokens must be equal (integers, exact); the device result must also be identical
// on a second launch and for every row launched alone (batch invariance).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"
#include "kernels/sampling.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

struct RowSpec {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  uint64_t seed;
  uint64_t step;
};

// Device buffers of one launch; Run() returns the tokens.
struct Batch {
  std::vector<float> logits;  // [rows, vocab]
  std::vector<RowSpec> rows;
  int vocab;

  void Run(int first, int count, std::vector<int32_t>* tokens) const {
    std::vector<float> t, tp, mp;
    std::vector<int32_t> tk;
    std::vector<uint64_t> sd, st;
    for (int r = first; r < first + count; ++r) {
      t.push_back(rows[r].temperature);
      tk.push_back(rows[r].top_k);
      tp.push_back(rows[r].top_p);
      mp.push_back(rows[r].min_p);
      sd.push_back(rows[r].seed);
      st.push_back(rows[r].step);
    }
    DeviceBuffer<float> dlogits(static_cast<size_t>(count) * vocab), dt(count), dtp(count),
        dmp(count);
    DeviceBuffer<int32_t> dtk(count), dtok(count);
    DeviceBuffer<uint64_t> dsd(count), dst(count);
    ASSERT_TRUE(dlogits.ok() && dt.ok() && dtp.ok() && dmp.ok() && dtk.ok() && dtok.ok() &&
                dsd.ok() && dst.ok());
    MORSERVE_CUDA_OK(cudaMemcpy(dlogits.get(), logits.data() + static_cast<size_t>(first) * vocab,
                                static_cast<size_t>(count) * vocab * sizeof(float),
                                cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dt.Upload(t));
    MORSERVE_CUDA_OK(dtk.Upload(tk));
    MORSERVE_CUDA_OK(dtp.Upload(tp));
    MORSERVE_CUDA_OK(dmp.Upload(mp));
    MORSERVE_CUDA_OK(dsd.Upload(sd));
    MORSERVE_CUDA_OK(dst.Upload(st));
    MORSERVE_CUDA_OK(dtok.Poison());
    DeviceSamplingParams p;
    p.logits = dlogits.get();
    p.rows = count;
    p.vocab = vocab;
    p.temperature = dt.get();
    p.top_k = dtk.get();
    p.top_p = dtp.get();
    p.min_p = dmp.get();
    p.seed = dsd.get();
    p.step = dst.get();
    p.token = dtok.get();
    MORSERVE_CUDA_OK(sampling_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    MORSERVE_CUDA_OK(dtok.Download(tokens));
  }
};

int CpuToken(const Batch& b, int r, Sampler& sampler) {
  const RowSpec& s = b.rows[r];
  morserve::SamplingParams params;
  params.temperature = s.temperature;
  params.top_k = s.top_k;
  params.top_p = s.top_p;
  params.min_p = s.min_p;
  std::vector<int> history(s.step, 0);  // its length is the RNG step; no penalties
  SampleInput in;
  in.logits = absl::MakeConstSpan(b.logits.data() + static_cast<size_t>(r) * b.vocab, b.vocab);
  in.params = &params;
  in.output_ids = history;
  in.seed = s.seed;
  return sampler.Sample(in).token;
}

class SamplingTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Check(int vocab, bool tied) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("vocab=" + std::to_string(vocab) + (tied ? " tied" : "") +
                 " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const float temps[] = {0.0f, 0.5f, 1.0f, 1.5f};
    const int ks[] = {0, 1, 2, 20, 50, vocab, -1};
    const float tps[] = {1.0f, 0.95f, 0.8f, 0.3f};
    const float mps[] = {0.0f, 0.0f, 0.05f, 0.3f};
    Batch b;
    b.vocab = vocab;
    const int rows = 160;
    std::normal_distribution<float> dist(0.0f, 2.5f);
    std::uniform_int_distribution<int> pick(0, 1 << 30);
    for (int r = 0; r < rows; ++r) {
      RowSpec s;
      s.temperature = temps[pick(rng) % 4];
      s.top_k = ks[pick(rng) % 7];
      s.top_p = tps[pick(rng) % 4];
      s.min_p = mps[pick(rng) % 4];
      s.seed = (static_cast<uint64_t>(pick(rng)) << 32) ^ pick(rng);
      s.step = pick(rng) % 300;
      b.rows.push_back(s);
      for (int i = 0; i < vocab; ++i) {
        float x = dist(rng);
        if (tied) {
          x = std::round(x * 2.0f) / 2.0f;  // many equal logits
          if (i % 97 == 5) x = -std::numeric_limits<float>::infinity();
        }
        b.logits.push_back(x);
      }
    }
    std::vector<int32_t> got, again;
    ASSERT_NO_FATAL_FAILURE(b.Run(0, rows, &got));
    ASSERT_NO_FATAL_FAILURE(b.Run(0, rows, &again));
    EXPECT_EQ(got, again) << "two launches differ";
    Sampler sampler;
    for (int r = 0; r < rows; ++r) {
      const RowSpec& s = b.rows[r];
      ASSERT_EQ(got[r], CpuToken(b, r, sampler))
          << "row " << r << ": temperature " << s.temperature << " top_k " << s.top_k << " top_p "
          << s.top_p << " min_p " << s.min_p << " seed " << s.seed << " step " << s.step;
    }
    for (int r = 0; r < rows; r += 7) {
      std::vector<int32_t> one;
      ASSERT_NO_FATAL_FAILURE(b.Run(r, 1, &one));
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
}

}  // namespace
}  // namespace morserve::kernels
