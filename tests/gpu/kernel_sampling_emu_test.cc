// The device sampling kernel (the same source as the GPU build: kernels/sampling_kernels.cuh)
// on the CPU emulator (tests/gpu/cuda_emu.h) against the engine's CPU Sampler, exactly:
// greedy, temperature, top_k, top_p, min_p and combinations on continuous and heavily tied
// logits, plus batch invariance. Small vocabularies keep it fast; the GPU test covers 49152.
// Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"
#include "kernels/sampling_kernels.cuh"

namespace morserve::kernels {
namespace {

struct RowSpec {
  float temperature;
  int32_t top_k;
  float top_p, min_p;
  uint64_t seed, step;
};

// Emulated launch over `rows` rows of [vocab] logits.
std::vector<int32_t> Emulate(const std::vector<float>& logits, const std::vector<RowSpec>& rows,
                             int vocab) {
  const int n = static_cast<int>(rows.size());
  std::vector<float> t, tp, mp;
  std::vector<int32_t> tk, token(n, -7);
  std::vector<uint64_t> sd, st;
  for (const RowSpec& r : rows) {
    t.push_back(r.temperature);
    tk.push_back(r.top_k);
    tp.push_back(r.top_p);
    mp.push_back(r.min_p);
    sd.push_back(r.seed);
    st.push_back(r.step);
  }
  const Args a{logits.data(), vocab,     vocab,     t.data(),  tk.data(),
               tp.data(),     mp.data(), sd.data(), st.data(), token.data()};
  cuda_emu::Run({static_cast<unsigned>(n), 1, 1}, kThreads, [&] { SampleKernel(a); });
  return token;
}

int CpuToken(const float* logits, int vocab, const RowSpec& r, Sampler& sampler) {
  morserve::SamplingParams params;
  params.temperature = r.temperature;
  params.top_k = r.top_k;
  params.top_p = r.top_p;
  params.min_p = r.min_p;
  std::vector<int> history(r.step, 0);  // its length is the RNG step
  SampleInput in;
  in.logits = absl::MakeConstSpan(logits, vocab);
  in.params = &params;
  in.output_ids = history;
  in.seed = r.seed;
  return sampler.Sample(in).token;
}

void Check(int vocab, bool tied) {
  std::random_device rd;
  const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  SCOPED_TRACE("vocab=" + std::to_string(vocab) + (tied ? " tied" : "") +
               " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const float temps[] = {0.0f, 0.5f, 1.0f, 1.5f};
  const int ks[] = {0, 1, 3, 20, vocab, -1};
  const float tps[] = {1.0f, 0.95f, 0.7f, 0.2f};
  const float mps[] = {0.0f, 0.0f, 0.02f, 0.3f};
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 1 << 30);
  const int n = 24;
  std::vector<RowSpec> rows;
  std::vector<float> logits;
  for (int r = 0; r < n; ++r) {
    rows.push_back({temps[pick(rng) % 4], ks[pick(rng) % 6], tps[pick(rng) % 4], mps[pick(rng) % 4],
                    (static_cast<uint64_t>(pick(rng)) << 32) ^ pick(rng),
                    static_cast<uint64_t>(pick(rng) % 100)});
    for (int i = 0; i < vocab; ++i) {
      float x = dist(rng);
      if (tied) {
        x = std::round(x * 2.0f) / 2.0f;
        if (i % 37 == 3) x = -std::numeric_limits<float>::infinity();
      }
      logits.push_back(x);
    }
  }
  const std::vector<int32_t> got = Emulate(logits, rows, vocab);
  Sampler sampler;
  for (int r = 0; r < n; ++r) {
    const RowSpec& s = rows[r];
    ASSERT_EQ(got[r], CpuToken(&logits[static_cast<size_t>(r) * vocab], vocab, s, sampler))
        << "row " << r << ": temperature " << s.temperature << " top_k " << s.top_k << " top_p "
        << s.top_p << " min_p " << s.min_p << " seed " << s.seed << " step " << s.step;
  }
  for (int r : {0, n / 2, n - 1}) {  // alone
    const std::vector<float> one(logits.begin() + static_cast<size_t>(r) * vocab,
                                 logits.begin() + static_cast<size_t>(r + 1) * vocab);
    ASSERT_EQ(Emulate(one, {rows[r]}, vocab)[0], got[r]) << "row " << r << " alone";
  }
}

TEST(SamplingEmuTest, MatchesCpuSampler) {
  ASSERT_NO_FATAL_FAILURE(Check(1000, false));
  ASSERT_NO_FATAL_FAILURE(Check(1000, true));
  ASSERT_NO_FATAL_FAILURE(Check(3001, true));  // not a multiple of the block size
}

// Planted cases: top_k ties resolved by lowest id, top_k 1 == greedy, all -inf -> -1.
TEST(SamplingEmuTest, PlantedCases) {
  const int vocab = 600;
  std::vector<float> logits(3 * vocab, 0.0f);
  for (int i = 0; i < vocab; ++i) logits[i] = (i == 10 || i == 500) ? 5.0f : -1.0f;
  for (int i = 0; i < vocab; ++i) logits[vocab + i] = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) logits[2 * vocab + i] = static_cast<float>(i % 7);
  const std::vector<RowSpec> rows = {{1.0f, 1, 1.0f, 0.0f, 1, 0},   // top_k 1: the lower tie, 10
                                     {1.0f, 0, 1.0f, 0.0f, 2, 3},   // all -inf: -1
                                     {0.8f, 2, 1.0f, 0.0f, 3, 5}};  // ties at 6: ids 6 and 13 only
  const std::vector<int32_t> got = Emulate(logits, rows, vocab);
  EXPECT_EQ(got[0], 10);
  EXPECT_EQ(got[1], -1);
  EXPECT_TRUE(got[2] == 6 || got[2] == 13) << got[2];
}

}  // namespace
}  // namespace morserve::kernels
